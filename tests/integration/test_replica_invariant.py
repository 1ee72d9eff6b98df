"""The central invariant on the path users train through: real worker processes run the Spark
task's own loop (compute_update -> encode -> submit(apply_locally=True) -> wait_acknowledged), with no
lock held around compute_update, for psrv.nn.Network and TorchNetwork. Afterwards every replica equals
the master copy within float32 rounding, and the master holds every submitted update exactly once."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from psrv.nn.data import DataSet
from psrv.server import Controller
from psrv.transport import TransportConfig
from worker_setups import digits_network, master_after, sharing_setup

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
WORKER = Path(__file__).with_name("replica_worker.py")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


CUDA = _has_cuda()
NEEDS_CUDA = pytest.mark.skipif(not CUDA, reason="needs CUDA (torch.cuda.is_available() is False here)")
WORKERS = 2


def _digits_batches(seed: int) -> list[list[DataSet]]:
    from sklearn.datasets import load_digits

    data = load_digits()
    full = DataSet.from_class_indices((data.data / 16.0).astype(np.float32), data.target.astype(np.int64), 10)
    full.shuffle(seed)
    batches = list(full.batches(16))
    return [batches[i::WORKERS] for i in range(WORKERS)]


def _network(kind: str):
    return digits_network(kind, 128)


def _train(kind: str, mode: str, tmp_path: Path, step_from: str = "shared", device: str | None = None,
           device_sharing: bool = False, workers_per_node: int = 1,
           local_steps: int = 1) -> tuple[np.ndarray, np.ndarray, list, list[np.ndarray]]:
    """(initial params, final master, worker results, per-worker sums of what each submitted). With
    ``device`` every worker process trains there (``PSRV_DEVICE``, as a Spark executor's environment sets
    it) and records its events, the device included."""
    network = _network(kind)
    initial = np.array(network.params, dtype=np.float64, copy=True)
    config = TransportConfig(heartbeat_s=0.5, missed_beats=6, join_timeout_s=30, linger_s=0.5)
    controller = Controller(config, np.array(network.params, copy=True),
                            updater_state=np.array(network.updater_state, copy=True)).start()
    procs = []
    try:
        setup = dataclasses.replace(sharing_setup(controller.address, config, network), step_from=step_from,
                                    collect_stats=device is not None, workers_per_node=workers_per_node,
                                    local_steps=local_steps)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if device is not None:
            env["PSRV_DEVICE"] = device
        for i, batches in enumerate(_digits_batches(seed=11)):
            source, target = tmp_path / f"in{i}.pkl", tmp_path / f"out{i}.pkl"
            with open(source, "wb") as fh:
                pickle.dump({"setup": setup, "batches": batches * 3, "mode": mode,
                             "device_sharing": device_sharing}, fh)
            log = open(tmp_path / f"worker{i}.log", "w")  # noqa: SIM115 - the child inherits it
            procs.append((subprocess.Popen([sys.executable, str(WORKER), str(source), str(target)],
                                           stdout=log, stderr=subprocess.STDOUT,
                                           env=env), target, i))
            log.close()
        results, sent = [], []
        for proc, target, i in procs:
            rc = proc.wait(timeout=180)
            assert rc == 0, f"worker {i} exited {rc}:\n{(tmp_path / f'worker{i}.log').read_text()[-3000:]}"
            with open(target, "rb") as fh:
                out = pickle.load(fh)
            results.extend(out["results"])
            sent.append(out["sent"])
        expected = sum(r.counters["updates_sent"] for r in results)
        master = master_after(controller, expected)
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
        controller.stop()
    return initial, master, results, sent


def _relative_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize(("kind", "step_from"), [("network", "shared"), ("torch", "shared"), ("torch", "own"),
                                                  ("network", "own")])
def test_every_replica_equals_the_master_after_the_drain(kind: str, step_from: str, tmp_path: Path) -> None:
    """step_from="own" (a TorchNetwork steps from its replica plus its residual) keeps the invariant: what
    it steps from is a copy, the replica holds only what was sent; a Network steps from its replica."""
    initial, master, results, sent = _train(kind, "fixed", tmp_path, step_from)
    assert len(results) == WORKERS and all(r.messages > 10 for r in results), [r.messages for r in results]
    assert {r.step_from for r in results} == {"own" if (kind, step_from) == ("torch", "own") else "shared"}
    # nothing lost, nothing twice: the master is the initial copy plus every submitted update once
    assert _relative_l2(master, initial + sum(sent)) <= 1e-6
    for r in results:  # each replica, checked by the task itself against a snapshot of the master
        assert r.replica is not None and r.replica["status"] == "equal", r.replica
        assert r.replica["relative_l2"] <= 1e-6, r.replica


@pytest.mark.parametrize(("kind", "step_from", "device_sharing", "workers_per_node", "device"), [
    ("torch", "own", False, 1, None),     # on the host: the one-pass sum, from the replica plus the residual
    ("torch", "shared", False, 1, None),  # on the host, from the replica alone
    ("torch", "own", True, 1, None),      # the device path, on CPU tensors
    pytest.param("torch", "own", True, 1, "cuda:0", marks=[pytest.mark.gpu, NEEDS_CUDA]),  # ... on a GPU
    ("torch", "own", False, 2, None),     # two local workers behind one node
    ("network", "shared", False, 1, None),  # a psrv.nn.Network takes one step a message and says so
])
def test_several_optimizer_steps_a_message_keep_the_invariant_on_every_step_path(
        kind: str, step_from: str, device_sharing: bool, workers_per_node: int, device: str | None,
        tmp_path: Path) -> None:
    """local_steps=3: every step path of the task takes three optimizer steps a minibatch (Adam's step
    count says so: three per minibatch of 16 rows, two for the short one of 5, whose pieces hold two rows
    at least) and sends one message a minibatch; every replica still equals the master copy, the master
    holds every update once, and the model learns as one process does."""
    initial, master, results, sent = _train(kind, "fixed", tmp_path, step_from, device=device,
                                            device_sharing=device_sharing, workers_per_node=workers_per_node,
                                            local_steps=3)
    if device is not None:
        assert {e["device"] for r in results for e in r.events if e["kind"] == "setup"} == {device}
    taken = 3 if kind == "torch" else 1
    assert {r.local_steps for r in results} == {taken}
    minibatches = sum(len(b) for b in _digits_batches(seed=11)) * 3
    assert sum(r.steps for r in results) == minibatches
    assert all(r.messages == -(-r.steps // workers_per_node) for r in results)  # one a round of the node
    if kind == "torch":  # Adam's step count of the first parameter: after its two moments (keys sorted)
        first = _network("torch").module[0].weight.numel()
        # each node's count, as the task reports it: the mean of its local workers', each taking every
        # workers_per_node-th minibatch of the node, 3 epochs of min(3, rows // 2) steps each
        def steps(batches: list) -> int:
            return 3 * sum(max(1, min(taken, b.num_examples // 2)) for b in batches)

        expected = [np.mean([steps(node[j::workers_per_node]) for j in range(workers_per_node)])
                    for node in _digits_batches(seed=11)]
        counts = [float(np.asarray(r.updater_state)[2 * first]) for r in results]
        assert sorted(counts) == pytest.approx(sorted(expected))
        assert sum(counts) < taken * sum(r.steps for r in results) / workers_per_node  # the short minibatch
    assert _relative_l2(master, initial + sum(sent)) <= 1e-6
    for r in results:
        assert r.replica is not None and r.replica["status"] == "equal", r.replica
    shared, alone = _accuracy(_network(kind), master), _one_process_accuracy()
    assert shared >= alone - 0.02, (shared, alone)


def test_the_check_catches_a_network_that_writes_params_during_its_step(tmp_path: Path) -> None:
    """The old TorchNetwork bug (snapshot, step, copy back) re-created: the replicas' own checks say
    "differs" (the master keeps every update; a replica lost those decoded during its steps)."""
    initial, master, results, sent = _train("network", "legacy", tmp_path)
    assert _relative_l2(master, initial + sum(sent)) <= 1e-6  # the master copy is still right
    statuses = [r.replica["status"] for r in results]
    assert "differs" in statuses, [r.replica for r in results]


def _accuracy(network, params: np.ndarray) -> float:
    """The accuracy of ``params`` on every digit row (the rows both ways trained on)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    network.set_params(np.asarray(params, dtype=np.float32))
    predicted = np.asarray(network.output((data.data / 16.0).astype(np.float32))).argmax(axis=1)
    return float((predicted == data.target).mean())


def _one_process_accuracy() -> float:
    """The reference: one process, the same network and optimizer, every worker's minibatches in turn."""
    network = _network("torch")
    shards = _digits_batches(seed=11)
    order = [b for pair in zip(*shards, strict=False) for b in pair] + shards[0][len(shards[1]):]
    for _ in range(3):
        for batch in order:
            update, _ = network.compute_update(batch.features, batch.labels)
            network.apply_update(update)
    return _accuracy(network, network.params)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=[pytest.mark.gpu, NEEDS_CUDA])])
@pytest.mark.parametrize("workers_per_node", [1, 2])
def test_two_workers_on_one_device_keep_the_invariant_and_learn_as_one_process(
        device: str, workers_per_node: int, tmp_path: Path) -> None:
    """The Spark task's own loop in two processes on one device, through the device path (DeviceSharing:
    the residual, the encoding and the replica's decodes on the device; on CPU tensors in CI, on the one
    GPU both workers share where the device is CUDA), statistics collected, with one trainer per task or
    two (``workers_per_node``: threads on the one device): every replica equals the master, the master
    holds every update once, and it is as accurate as one process on the same rows."""
    initial, master, results, sent = _train("torch", "fixed", tmp_path, step_from="own", device=device,
                                            device_sharing=True, workers_per_node=workers_per_node)
    assert {e["device"] for r in results for e in r.events if e["kind"] == "setup"} == {device}
    assert {r.local_workers for r in results} == {workers_per_node}
    encoded = [e for r in results for e in r.events if e["kind"] == "encode" and e["bytes"] > 0]
    assert len(encoded) == sum(r.messages for r in results)
    assert all(e["elements"] > 0 for e in encoded)  # counted by the encoder, on the host
    assert {r.step_from for r in results} == {"own"}
    assert _relative_l2(master, initial + sum(sent)) <= 1e-6
    for r in results:
        assert r.replica is not None and r.replica["status"] == "equal", r.replica
    shared, alone = _accuracy(_network("torch"), master), _one_process_accuracy()
    assert shared >= alone - 0.02, (shared, alone)
