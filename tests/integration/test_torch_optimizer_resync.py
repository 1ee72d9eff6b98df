"""DistributedOptimizer's implicit residual across a re-sync, over real ZeroMQ sockets: a worker cut off
(tests/faults/proxy.py) for longer than the liveness timeout (2 s) while it keeps stepping rejoins under a new
id, downloads the master copy (the install hook) and re-applies the own updates the master lacks (the
apply hook). The residual (step buffer minus live parameters) is the same before and after, up to float
rounding; after the drain the replica equals the master, which holds every update of both workers
exactly once (everything on a grid of 2^-12 with updates of +-2^-10: one update missing or applied twice
moves an element by a whole step)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import wait_until
from psrv.encoding import FixedThreshold, decode
from psrv.server import Controller, Node
from psrv.server.cli.synthetic import SyntheticUpdates
from psrv.transport import TransportConfig

from tests.faults.proxy import FaultProxy

torch = pytest.importorskip("torch")

from psrv.torch import DistributedOptimizer  # noqa: E402

GRID, TAU = 2.0**-12, 2.0**-10


def _config(name: str) -> TransportConfig:  # offline after 2 s of silence
    return TransportConfig(heartbeat_s=0.25, missed_beats=8, join_timeout_s=10, linger_s=0.0, node_name=name,
                           controller_lost_timeout_s=30.0)


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with torch.no_grad():  # weights loaded before wrapping
        for p in model.parameters():
            p.copy_(torch.round(p / GRID) * GRID)
    return model


@pytest.mark.timeout(90)
def test_the_residual_survives_a_resync_and_the_replica_equals_the_master() -> None:
    model = _model()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, join=False,
                               threshold_algorithm=FixedThreshold(TAU))
    opt.implicit.warm_up()  # as joining does: no kernel compiles while the roles of this process beat
    live = opt.flat_params.numpy()
    start = live.astype(np.float64)
    submitted = np.zeros_like(start)  # every update either worker sent, summed exactly
    ctrl = Controller(_config("controller"), live.copy()).start()
    proxy = FaultProxy(ctrl.address).start()
    nodes: list[Node] = []
    try:
        steady = Node(_config("steady"), live.copy(), ctrl.address).start()
        nodes.append(steady)
        worker = Node(_config("worker"), opt.implicit.node_params, proxy.address,
                      **opt.implicit.node_hooks()).start()
        nodes.append(worker)
        opt.node, opt.lock = worker, worker.lock  # what joining through a launcher sets
        submit = worker.submit

        def recording_submit(message, **kwargs):
            decode(message, submitted)
            return submit(message, **kwargs)

        worker.submit = recording_submit
        source = SyntheticUpdates(opt.num_params, sparsity=0.05, threshold=TAU, seed=7)
        rng = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 16, generator=rng), torch.randint(0, 4, (64,), generator=rng)

        def train(steps: int) -> None:
            for _ in range(steps):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                message = source.next_message()
                decode(message, submitted)
                steady.submit(message, apply_locally=True)

        train(15)
        cut_id = worker.node_id
        proxy.block()
        train(10)  # sent into the cut: the master lacks them until the worker rejoins and sends them again
        online = lambda: {n["id"] for n in ctrl.status()["nodes"] if n["state"] == "online"}  # noqa: E731
        wait_until(lambda: cut_id not in online(), 20, "the cut worker offline")
        residual_before, live_before = opt.state_dict()["residual"], live.copy()
        resyncs = worker.counters()["resyncs"]
        proxy.unblock()
        wait_until(lambda: worker.node_id != cut_id and str(worker.state) == "running", 30,
                   "the worker rejoined and caught up")
        assert worker.counters()["resyncs"] == resyncs + 1  # the download, installed through the hook
        rounding = 4 * np.spacing(np.abs(live_before).max() + np.abs(residual_before).max())
        np.testing.assert_allclose(opt.state_dict()["residual"], residual_before, rtol=0, atol=rounding)
        assert np.abs(residual_before).max() > 10 * rounding
        train(10)
        # the steady node's last updates reach the master and the worker before the worker leaves (a
        # worker that stops first would rightly lack an update the master applied after it left)
        assert steady.wait_acknowledged(20.0)
        wait_until(lambda: np.array_equal(live.astype(np.float64), start + submitted), 20,
                   "every update in the worker's replica exactly once")
        report = opt.leave()
        assert report["acknowledged"] and report["replica"]["status"] == "equal", report
        wait_until(lambda: np.array_equal(ctrl.params.astype(np.float64), start + submitted), 20,
                   "every update in the master exactly once")
        np.testing.assert_array_equal(live, ctrl.params)
        assert report["messages"] > 20
    finally:
        for node in reversed(nodes):
            node.stop()
        proxy.stop()
        ctrl.stop()
