"""The quality harness (scripts/quality) against answers known exactly on a tiny float64 task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from psrv.encoding import (  # noqa: E402
    FixedThreshold,
    NoResidualPostProcessor,
    ResidualEncoder,
    SampledQuantileThreshold,
    decode,
)
from psrv.nn import TorchNetwork  # noqa: E402
from quality import harness, tasks  # noqa: E402

F64 = torch.float64


def _plain_loop(task, setting, encoder=None) -> np.ndarray:
    """What one worker does without the harness: TorchNetwork steps over the same minibatches, applied
    directly (the plain optimizer) or through its own encoder and decode."""
    net = TorchNetwork(harness.initial_module(task, setting, F64), torch.nn.CrossEntropyLoss(),
                       task.input_shape, optimizer=setting.make_optimizer)
    for (x, y), in harness.batches(task, setting):
        update, _ = net.compute_update(x.astype(np.float64), harness._onehot(y, task.classes, np.float64))
        if encoder is None:
            net.apply_update(update)
        else:
            message = encoder.encode_update(update)
            if message is not None:
                decode(message, net.params)
    return net.params.copy()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_one_worker_without_quantization_is_the_plain_optimizer_bit_for_bit(optimizer) -> None:
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer=optimizer, workers=1)
    shared = harness.sharing(task, setting, harness.Sharing(codec="exact"), dtype=F64)
    np.testing.assert_array_equal(shared.params, _plain_loop(task, setting))
    assert shared.replica_gap == 0.0


def test_one_worker_with_a_small_tau_is_the_encoder_loop_bit_for_bit() -> None:
    """The real codec: every element moves by +-tau each step, exactly as a worker's own loop does."""
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="adam", workers=1)
    config = harness.Sharing(lambda: FixedThreshold(1e-5), NoResidualPostProcessor)
    shared = harness.sharing(task, setting, config, dtype=F64)
    encoder = ResidualEncoder(shared.params.size, dtype=np.float64, threshold_algorithm=FixedThreshold(1e-5),
                              post_processor=NoResidualPostProcessor())
    np.testing.assert_array_equal(shared.params, _plain_loop(task, setting, encoder))
    start = harness._flat(harness.initial_module(task, setting, F64))
    moved = (shared.params - start) / float(np.float32(1e-5))
    np.testing.assert_allclose(moved, np.round(moved), atol=1e-6)  # every element moved by whole taus
    assert np.abs(moved).max() >= 1


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_synchronous_averaging_is_one_process_with_the_combined_batch(optimizer) -> None:
    task = tasks.make("tiny")
    for workers in (1, 3):
        synchronous = harness.synchronous(task, harness.Setting(optimizer=optimizer, workers=workers), F64)
        combined = tasks.make("tiny", batch_size=task.batch_size * workers)
        one = harness.one_process(combined, harness.Setting(optimizer=optimizer, workers=1), F64)
        assert synchronous.steps == one.steps
        if workers == 1:
            np.testing.assert_array_equal(synchronous.params, one.params)
        else:  # the mean of the workers' mean gradients: equal up to the order of the float sums
            np.testing.assert_allclose(synchronous.params, one.params, rtol=1e-10, atol=1e-12)


def test_sharing_with_delay_and_jitter_drains_every_replica_to_the_master_copy() -> None:
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="adam", workers=3)
    quantile = harness.Sharing(SampledQuantileThreshold, delay=2, jitter=2)
    result = harness.sharing(task, setting, quantile, dtype=F64)
    assert result.bytes_total > 0 and result.bitmaps_after3 == 0
    assert result.replica_gap < 1e-12  # every message applied once on every replica, in some order
    synchronous = harness.synchronous(task, setting, F64)
    assert not np.array_equal(result.params, synchronous.params)


def test_every_method_sees_the_same_minibatches() -> None:
    task = tasks.make("tiny")
    one = [b for r in harness.batches(task, harness.Setting(workers=1)) for b in r]
    rounds = harness.batches(task, harness.Setting(workers=4))
    flat = [b for r in rounds for b in r]
    assert all(len(r) == 4 for r in rounds)
    for (x1, y1), (x2, y2) in zip(flat, one, strict=False):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_bench_quality_help() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_quality.py"), "--help"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "--workers" in out and "--delay" in out and "--target" in out


def test_flush_threshold_takes_the_most_squared_norm_out_of_the_residual() -> None:
    rng = np.random.default_rng(3)
    residual = rng.normal(size=500) * rng.uniform(0.1, 3, size=500)

    def left(tau: float) -> float:  # the squared norm after one message at tau
        sent = np.where(np.abs(residual) >= tau, np.sign(residual) * tau, 0)
        return float(np.sum((residual - sent) ** 2))

    tau = harness.flush_threshold(residual)
    assert left(tau) == pytest.approx(min(left(abs(t)) for t in residual))
    assert left(tau) < 0.5 * float(np.sum(residual ** 2))
    assert harness.flush_threshold(np.zeros(10)) is None
    algorithm = harness.FlushingQuantile(every=3)
    taus = []
    for _ in range(6):
        algorithm.prepare(residual)
        taus.append(algorithm.threshold)
    assert taus[2] == taus[5] == tau and taus[0] == taus[1] != tau  # every third step flushes


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_flush_and_momentum_masking_keep_every_replica_on_the_master_copy(optimizer) -> None:
    """An end-of-run flush and factor masking change what is sent, never the invariant; masking zeroes
    the optimizer's momentum exactly where the last message sent an element."""
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer=optimizer, workers=3)
    config = harness.Sharing(SampledQuantileThreshold, delay=1, jitter=1, flush_end=1, masking=True)
    result = harness.sharing(task, setting, config, dtype=F64)
    assert result.replica_gap < 1e-12
    plain = harness.sharing(task, setting, harness.Sharing(SampledQuantileThreshold, delay=1, jitter=1),
                            dtype=F64)
    assert not np.array_equal(result.params, plain.params)
    net = TorchNetwork(harness.initial_module(task, setting, F64), torch.nn.CrossEntropyLoss(),
                       task.input_shape, optimizer=setting.make_optimizer)
    encoder = ResidualEncoder(net.num_params, dtype=np.float64,
                              threshold_algorithm=SampledQuantileThreshold(0.3, warmup_sparsity=0.3))
    encoder.residual[:] = np.random.default_rng(5).normal(scale=1e-3, size=net.num_params)
    (x, y), = harness.batches(task, harness.Setting(workers=1))[0]
    update, _ = net.compute_update(x.astype(np.float64), harness._onehot(y, task.classes, np.float64))
    key = "momentum_buffer" if optimizer == "sgd" else "exp_avg"

    def momentum() -> np.ndarray:
        return torch.cat([net.optimizer.state[p][key].reshape(-1) for p in net._step_params]).numpy().copy()

    before = momentum()
    message = encoder.encode_update(update)
    harness._mask_momentum(net, message)
    sent = np.zeros(net.num_params)
    decode(message, sent)
    assert 0 < np.count_nonzero(sent) < net.num_params
    after = momentum()
    assert np.all(after[sent != 0] == 0)
    np.testing.assert_array_equal(after[sent == 0], before[sent == 0])
