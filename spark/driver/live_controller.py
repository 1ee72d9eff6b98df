"""The gradient-sharing controller of one ``fit(epochs=N)`` call, kept alive across its epochs.

Each epoch is still its own Spark job (validation, callbacks and checkpoints run on the driver between
epochs, and validation needs the executors the training tasks would otherwise hold), but the controller,
its CurveZMQ keys and the master copy it holds live for the whole call: an epoch's tasks join the running
controller and download the master copy as their catch-up, instead of the driver starting a controller,
generating keys and uploading the parameters again each epoch. What each epoch reports (updates applied,
joins, bytes, the per-origin accounting) is the difference of the controller's counters across that
epoch, so ``last_fit`` reads as it did with one controller per epoch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.protocol import TrainableNetwork
from psrv.server import Controller
from psrv.spark.config import VoidConfiguration
from psrv.spark.errors import SparkConfigError
from psrv.transport.errors import TransportConfigError
from psrv.transport.keys import generate_keys

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)


@dataclass
class LiveController:
    """A started controller, the address the workers dial, and the keys it was started with."""

    controller: Controller
    address: str
    keys: Any
    kept: bool  # True: it outlives one epoch's job (stopped by the fit call that started it)
    handed: np.ndarray | None = None  # the parameters the driver's network got at the last epoch's end
    epochs: int = 0
    baseline: dict[str, Any] = field(default_factory=dict)

    def begin_epoch(self, network: TrainableNetwork) -> None:
        """Before an epoch's job: the driver's updater state (averaged over the workers) becomes the
        one joining nodes download; parameters the driver changed since the last epoch (a callback, a
        user) replace the master copy. Unchanged ones stay: updates that reached the controller after
        the last drain are kept, not overwritten."""
        controller = self.controller
        with controller.lock:
            if self.handed is not None and not np.array_equal(self.handed, network.params):
                controller.params[...] = np.asarray(network.params, dtype=controller.params.dtype)
                log.info("the driver's parameters changed between epochs: they replace the master copy")
            controller.updater_state = np.array(network.updater_state, copy=True)
        self.baseline = controller.counters_.snapshot()
        self.epochs += 1

    def end_epoch(self, network: TrainableNetwork) -> None:
        self.handed = np.array(network.params, copy=True)

    @property
    def joins_before(self) -> int:
        return int(self.baseline.get("joins", 0))

    @property
    def applied_before(self) -> int:
        return int(self.baseline.get("updates_applied", 0))

    def epoch_counters(self) -> dict[str, Any]:
        """The controller's counters of this epoch: numbers minus their values at its start, and
        ``applied_by_origin`` for the origins whose count moved."""
        now = self.controller.counters()
        out: dict[str, Any] = {}
        for key, value in now.items():
            before = self.baseline.get(key)
            if key == "applied_by_origin":
                before = before or {}
                out[key] = {o: int(n) - int(before.get(o, 0)) for o, n in value.items()
                            if int(n) != int(before.get(o, 0))}
            elif isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and isinstance(before, (int, float)) and key not in _GAUGES:
                out[key] = value - before
            else:
                out[key] = value
        return out


# values that are states, not running totals: reported as they are
_GAUGES = frozenset({"node_id", "mesh_version", "params_sum", "params_abs_sum", "params_crc32"})


def start_controller(conf: VoidConfiguration, spark_context: SparkContext, network: TrainableNetwork,
                     kept: bool) -> LiveController:
    """A controller holding ``network``'s parameters and updater state (keys generated when secure),
    bound on the first free port of ``conf.unicast_port`` (any free port by default)."""
    keys = None
    if conf.secure:
        keys = generate_keys()
    host = conf.controller_host(spark_context.getConf().get("spark.driver.host"))
    controller = _bind(conf, host, keys, network)
    address = conf.advertised_address(controller.address)
    log.info("gradient sharing: controller on %s (workers dial %s), mesh %s, %s%s", controller.address,
             address, conf.mesh_build_mode, "CurveZMQ" if keys else "no encryption",
             ", kept for every epoch of this fit" if kept else "")
    return LiveController(controller, address, keys, kept, handed=np.array(network.params, copy=True))


def _bind(conf: VoidConfiguration, host: str, keys: Any, network: TrainableNetwork) -> Controller:
    """Start a controller on the first port of ``conf.controller_ports()`` nobody else listens on."""
    ports = conf.controller_ports()
    for port in ports:
        controller = Controller(
            conf.transport_config(host=host, port=port, keys=keys),
            np.array(network.params, copy=True),
            updater_state=np.array(network.updater_state, copy=True),
        )
        try:
            return controller.start()
        except TransportConfigError as exc:
            if "in use" not in str(exc):
                raise
            log.debug("controller port %d on %s is taken: %s", port, host, exc)
    taken = f"port {ports[0]} is" if len(ports) == 1 else f"every port of {conf.unicast_port} is"
    raise SparkConfigError(
        f"the gradient-sharing controller cannot listen on {host}: {taken} already in use (another fit "
        "or program on this driver host): set VoidConfiguration(unicast_port=0) for any free port (the "
        "default; the tasks are told the port), another port, or a range such as unicast_port=(40100, "
        "40199)")


__all__ = ["LiveController", "start_controller"]
