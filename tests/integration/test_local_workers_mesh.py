"""Two local workers behind one node, on the path users train through: real worker processes run the
Spark task's own loop (``SharingTrainer``) against a real controller over ZeroMQ, one process with
``workers_per_node=2`` beside one with a single worker (so updates arrive during its rounds). The
two-worker node sends one message per round, its replica equals the master copy, and the master holds
every submitted update exactly once."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from psrv.nn.data import DataSet
from psrv.server import Controller
from psrv.transport import TransportConfig
from worker_setups import digits_network, master_after, sharing_setup

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
WORKER = Path(__file__).with_name("replica_worker.py")


def _batches() -> list[DataSet]:
    from sklearn.datasets import load_digits

    data = load_digits()
    full = DataSet.from_class_indices((data.data / 16.0).astype(np.float32), data.target.astype(np.int64), 10)
    full.shuffle(5)
    return list(full.batches(32))


def _network(kind: str):
    return digits_network(kind, 64)


@pytest.mark.parametrize("kind", ["network", "torch"])
def test_a_node_of_two_local_workers_keeps_the_replica_invariant(kind: str, tmp_path: Path) -> None:
    """A psrv.nn.Network steps from the replica; a TorchNetwork from the replica plus the node's residual
    (step_from="own": worker 0 from a loaded copy, worker 1's parameters set to that point)."""
    network = _network(kind)
    initial = np.array(network.params, dtype=np.float64, copy=True)
    config = TransportConfig(heartbeat_s=0.5, missed_beats=6, join_timeout_s=30, linger_s=0.5)
    controller = Controller(config, np.array(network.params, copy=True),
                            updater_state=np.array(network.updater_state, copy=True)).start()
    batches = _batches()
    shares = {2: batches[0::2] * 2, 1: batches[1::2]}  # (workers_per_node, the task's minibatches)
    procs, results, sent = [], {}, []
    try:
        base = sharing_setup(controller.address, config, network)
        for count, share in shares.items():
            source, target = tmp_path / f"in{count}.pkl", tmp_path / f"out{count}.pkl"
            with open(source, "wb") as fh:
                setup = replace(base, workers_per_node=count, step_from="own")
                pickle.dump({"setup": setup, "batches": share, "mode": "fixed"}, fh)
            log = open(tmp_path / f"worker{count}.log", "w")  # noqa: SIM115 - the child inherits it
            procs.append((subprocess.Popen([sys.executable, str(WORKER), str(source), str(target)],
                                           stdout=log, stderr=subprocess.STDOUT,
                                           env=dict(os.environ, OMP_NUM_THREADS="1")), target, count))
            log.close()
        for proc, target, count in procs:
            rc = proc.wait(timeout=180)
            log_text = (tmp_path / f"worker{count}.log").read_text()
            assert rc == 0, f"worker {count} exited {rc}:\n{log_text[-3000:]}"
            with open(target, "rb") as fh:
                out = pickle.load(fh)
            (results[count],) = out["results"]
            sent.append(out["sent"])
        expected = sum(r.counters["updates_sent"] for r in results.values())
        master = master_after(controller, expected)
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
        controller.stop()
    pair, single = results[2], results[1]
    assert pair.local_workers == 2 and single.local_workers == 1
    assert {pair.step_from, single.step_from} == {"own" if kind == "torch" else "shared"}
    assert pair.steps == len(shares[2]) and pair.examples == sum(b.num_examples for b in shares[2])
    assert pair.messages == (len(shares[2]) + 1) // 2  # one message per round of two minibatches
    assert single.messages == len(shares[1])
    # nothing lost, nothing twice: the master is the initial copy plus every submitted update once
    total = initial + sum(sent)
    assert float(np.linalg.norm(master - total) / np.linalg.norm(total)) <= 1e-6
    for r in (pair, single):  # each replica, checked by the task itself against the master copy
        assert r.replica is not None and r.replica["status"] == "equal", r.replica
