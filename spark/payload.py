"""What travels from the driver to the executors to rebuild a network: config + flat vectors.

The network is never pickled whole: its JSON-able configuration, its flat parameter vector,
optionally its flat updater state, its buffers (BatchNorm statistics: state that is not a parameter)
and its normalizer state are enough to rebuild an identical network on an executor
(``Network.from_config`` + copying the vectors in). The tasks build and cache their networks from it
(psrv.spark.task.worker); a torch network is built on the task's device (psrv.spark.task.device).
"""

from __future__ import annotations

import inspect
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from psrv.nn.network import Network as LayerNetwork
from psrv.nn.normalizers import normalizer_from_state
from psrv.nn.protocol import BufferedNetwork, TrainableNetwork
from psrv.spark.errors import SparkConfigError

_lineages: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_lineage_lock = threading.Lock()


def lineage(network: Any) -> str:
    """The token naming this driver-side network object (the same for all its fits)."""
    with _lineage_lock:
        try:
            token = _lineages.get(network)
            if token is None:
                token = _lineages[network] = uuid.uuid4().hex
        except TypeError:  # not weak-referenceable: a fresh token per payload (always rebuilt)
            token = uuid.uuid4().hex
    return token


def _file_form(network: Any) -> bytes:
    """The network's file form with ``__main__``/notebook code pickled by value (cloudpickle)."""
    try:
        accepts = "pickle_module" in inspect.signature(network.to_bytes).parameters
    except (TypeError, ValueError):
        accepts = False
    if not accepts:
        return network.to_bytes()
    from pyspark import cloudpickle

    return network.to_bytes(pickle_module=cloudpickle)


@dataclass
class NetworkPayload:
    config: dict
    params: np.ndarray
    updater_state: np.ndarray | None = None
    normalizer_state: dict | None = None
    iteration: int = 0
    epoch: int = 0
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    # networks that are code rather than data (psrv.nn.TorchNetwork) travel in their own file form
    blob: bytes | None = None
    factory: Any = None
    buffers: dict[str, np.ndarray] | None = None  # by name; None for networks without buffers
    lineage: str = ""

    @classmethod
    def from_network(cls, network: TrainableNetwork, *, with_updater: bool = False) -> NetworkPayload:
        blob, factory = None, None
        if not isinstance(network, LayerNetwork):
            if not isinstance(network, TrainableNetwork):
                raise SparkConfigError(
                    f"cannot ship a {type(network).__name__} to the executors: expected a psrv.nn.Network "
                    "or a network with to_bytes() and from_bytes() (e.g. psrv.nn.TorchNetwork)"
                )
            blob, factory = _file_form(network), type(network)
        normalizer = network.normalizer
        return cls(
            config=network.get_config(),
            params=np.array(network.params, dtype=network.params.dtype, copy=True),
            updater_state=np.array(network.updater_state, copy=True) if with_updater else None,
            normalizer_state=normalizer.get_state() if normalizer is not None else None,
            iteration=int(network.iteration),
            epoch=int(network.epoch),
            blob=blob,
            factory=factory,
            buffers=buffers_of(network),
            lineage=lineage(network),
        )

    def build(self, device: Any = None) -> TrainableNetwork:
        """A new network equal to the one this payload was made from (a torch one on ``device``)."""
        if self.blob is not None:
            network = self.factory.from_bytes(self.blob, device=device) if device is not None \
                and takes_device(self.factory) else self.factory.from_bytes(self.blob)
        else:
            network = LayerNetwork.from_config(self.config)
        self.load_into(network)
        if self.normalizer_state is not None:
            network.normalizer = normalizer_from_state(self.normalizer_state)
        return network

    def load_into(self, network: TrainableNetwork) -> None:
        """Copy parameters (and updater state, counters) into an already built network."""
        if network.params.shape != self.params.shape:
            raise SparkConfigError(
                f"parameter vector of {self.params.size} floats does not fit a network of "
                f"{network.params.size} parameters"
            )
        network.set_params(self.params)  # params may be a host copy of a device network: set, not write
        if self.updater_state is not None:
            network.set_updater_state(self.updater_state)
        if self.buffers is not None and isinstance(network, BufferedNetwork):
            network.set_buffers(self.buffers)
        set_counters(network, self.iteration, self.epoch)


def takes_device(factory: Any) -> bool:
    """Whether a network class builds on a chosen device (``from_bytes(..., device=)``: TorchNetwork)."""
    if factory is None:
        return False
    try:
        return "device" in inspect.signature(factory.from_bytes).parameters
    except (TypeError, ValueError):
        return False


def buffers_of(network: TrainableNetwork) -> dict[str, np.ndarray] | None:
    """Host copies of a network's buffers by name (None when it has no such notion, e.g. psrv.nn.Network)."""
    return network.get_buffers() if isinstance(network, BufferedNetwork) else None


def add_buffers(total: dict[str, np.ndarray] | None, buffers: dict[str, np.ndarray] | None
                ) -> dict[str, np.ndarray] | None:
    """Sum of buffers by name in float64 (``total`` is updated in place), for averaging them."""
    if buffers is None:
        return total
    if total is None:
        return {name: np.asarray(value, dtype=np.float64).copy() for name, value in buffers.items()}
    for name, value in buffers.items():
        total[name] += value
    return total


def mean_buffers(total: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """The average of ``count`` summed buffers; set_buffers rounds integer counters."""
    return {name: value / count for name, value in total.items()}


def set_counters(network: TrainableNetwork, iteration: int, epoch: int) -> None:
    """Set a network's iteration/epoch counters (used by learning-rate schedules)."""
    network.iteration = int(iteration)
    network.epoch = int(epoch)


__all__ = [
    "NetworkPayload", "add_buffers", "buffers_of", "lineage", "mean_buffers", "set_counters", "takes_device",
]
