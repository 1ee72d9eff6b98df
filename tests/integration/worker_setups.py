"""What the replica-worker tests share: the WorkerSetup a test hands to ``replica_worker.py`` (what the
driver would ship to a Spark task of a gradient-sharing fit: the network by value, DL4J's threshold and
residual clipping, for a controller the test started on loopback), the digits network they train (a
psrv.nn.Network or a TorchNetwork), the wait for the master to apply what the workers sent, and the
master copy read after it."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from psrv.encoding import AdaptiveThreshold, ResidualClipping
from psrv.server import Controller
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.setup import WorkerSetup
from psrv.transport import TransportConfig


def digits_network(kind: str, hidden: int) -> Any:
    """One hidden layer of ``hidden`` units on the 64 digit pixels, Adam(1e-2): a psrv.nn.Network for
    ``kind == "network"``, else a TorchNetwork (skipped where torch is missing)."""
    if kind == "network":
        from psrv.nn import Adam, Dense, Network, Output

        return Network([Dense(hidden, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2),
                       seed=3)
    import pytest

    torch = pytest.importorskip("torch")
    from psrv.nn.torch_adapter import TorchNetwork

    torch.manual_seed(3)
    module = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,),
                        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2))


def sharing_setup(controller_address: str, config: TransportConfig, network: Any) -> WorkerSetup:
    """One fit's setup: every worker of the test gets it (or a ``dataclasses.replace`` of it)."""
    return WorkerSetup(
        job_id=uuid.uuid4().hex[:8], controller_address=controller_address,
        transport=config.replace(host="127.0.0.1", port=0), network_mask=None,
        payload=NetworkPayload.from_network(network, with_updater=True),
        threshold_state=AdaptiveThreshold(1e-3).get_state(),
        post_processor_state=ResidualClipping(5, 5).get_state(), prefetch=2, debug=False,
        collect_stats=False, session_id=uuid.uuid4().hex,
    )


def wait_applied(controller: Controller, expected: int, timeout_s: float = 30.0) -> bool:
    """Whether the master applied ``expected`` updates within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if controller.counters()["updates_applied"] >= expected:
            return True
        time.sleep(0.05)
    return False


def master_after(controller: Controller, expected: int) -> np.ndarray:
    """The master copy (float64) once it applied ``expected`` updates; fails the test past the deadline."""
    assert wait_applied(controller, expected), \
        f"the controller applied {controller.counters()['updates_applied']} of {expected}"
    with controller.lock:
        return np.array(controller.params, dtype=np.float64, copy=True)
