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

import bench_quality  # noqa: E402
from psrv.encoding import (  # noqa: E402
    FixedThreshold,
    NoResidualPostProcessor,
    ResidualEncoder,
    SampledQuantileThreshold,
    decode,
)
from psrv.nn import TorchNetwork  # noqa: E402
from quality import harness, methods, report, tasks  # noqa: E402

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


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_compressed_gradients_without_quantization_are_synchronous_averaging_bit_for_bit(optimizer) -> None:
    task = tasks.make("tiny", 0)
    setting = harness.Setting(optimizer=optimizer, workers=3)
    exact = harness.compressed_gradients(task, setting, harness.Sharing(codec="exact"))
    np.testing.assert_array_equal(exact.params, harness.synchronous(task, setting).params)
    # quantized: a few percent of the bytes travel, and the run differs
    quantized = harness.compressed_gradients(task, setting, harness.Sharing(
        lambda: SampledQuantileThreshold(sparsity=0.03)))
    assert 0 < quantized.bytes_total < exact.bytes_total / 10
    assert not np.array_equal(quantized.params, exact.params)


def test_interleaved_workers_without_quantization_are_one_process_for_plain_sgd() -> None:
    """Workers stepping one after the other, each after the round's earlier workers' updates arrived,
    with plain SGD (no state of their own) and every step sent whole: the replicas take one process's
    steps over the same minibatches in the same order (equal up to the rounding of adding a step as a
    difference). Lock-step rounds, where each worker steps from the round's common point, do not."""
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="sgd", momentum=0.0, workers=3)
    one = harness.one_process(task, setting, F64)
    interleaved = harness.sharing(task, setting, harness.Sharing(codec="exact", interleave=True), dtype=F64)
    lockstep = harness.sharing(task, setting, harness.Sharing(codec="exact"), dtype=F64)
    np.testing.assert_allclose(interleaved.params, one.params, rtol=1e-10, atol=1e-12)
    assert interleaved.replica_gap < 1e-12
    assert np.max(np.abs(lockstep.params - one.params)) > 1e-6


def test_interleaved_workers_with_a_delay_still_drain_to_the_master_copy() -> None:
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="adam", workers=3)
    config = harness.Sharing(SampledQuantileThreshold, delay=1, jitter=1, own_point=True, interleave=True)
    result = harness.sharing(task, setting, config, dtype=F64)
    assert result.replica_gap < 1e-12 and result.bytes_total > 0
    plain = harness.sharing(task, setting, harness.Sharing(SampledQuantileThreshold, delay=1, jitter=1,
                                                           own_point=True), dtype=F64)
    assert not np.array_equal(result.params, plain.params)


def test_sharing_with_delay_and_jitter_drains_every_replica_to_the_master_copy() -> None:
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="adam", workers=3)
    quantile = harness.Sharing(SampledQuantileThreshold, delay=2, jitter=2)
    result = harness.sharing(task, setting, quantile, dtype=F64)
    assert result.bytes_total > 0 and result.bitmaps_after3 == 0
    assert result.bytes_total < result.bytes_unpacked  # counted as sent: packed, smaller than sparse
    assert result.replica_gap < 1e-12  # every message applied once on every replica, in some order
    synchronous = harness.synchronous(task, setting, F64)
    assert not np.array_equal(result.params, synchronous.params)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_one_worker_stepping_from_its_own_point_is_the_plain_optimizer_plus_nothing_lost(optimizer) -> None:
    """own_point (step_from="own"): one worker steps from its replica plus its residual, so its steps are
    the plain optimizer's; what it sent (the master copy) plus what it kept (the residual) is the plain
    optimizer's parameters, up to the rounding of that split."""
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer=optimizer, workers=1)
    config = harness.Sharing(lambda: FixedThreshold(1e-3), NoResidualPostProcessor, own_point=True)
    shared = harness.sharing(task, setting, config, dtype=F64)
    plain = _plain_loop(task, setting)
    np.testing.assert_allclose(shared.params + shared.residuals[0], plain, rtol=0, atol=1e-12)
    assert np.abs(shared.residuals[0]).max() > 1e-4  # something was held back, and still nothing lost
    assert shared.replica_gap == 0.0


def test_stepping_from_the_own_point_drains_every_replica_to_the_master_copy() -> None:
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="adam", workers=3)
    own = harness.sharing(task, setting, harness.Sharing(SampledQuantileThreshold, delay=2, jitter=2,
                                                         own_point=True), dtype=F64)
    replica = harness.sharing(task, setting, harness.Sharing(SampledQuantileThreshold, delay=2, jitter=2),
                              dtype=F64)
    assert own.replica_gap < 1e-12 and own.bytes_total > 0
    assert not np.array_equal(own.params, replica.params)


def test_scaled_momentum_is_each_worker_stepping_with_beta1_to_the_power_of_the_workers() -> None:
    """scale_momentum uses psrv.nn.momentum on every worker: bit for bit the run whose optimizer was
    given beta1 ** workers; the drain still leaves every replica on the master copy."""

    class GivenBeta(harness.Setting):
        def make_optimizer(self, params):
            return torch.optim.Adam(params, lr=1e-3, betas=(0.9 ** 3, 0.999))

    task = tasks.make("tiny", epochs=2)
    config = dict(threshold=SampledQuantileThreshold, delay=1, own_point=True)
    scaled = harness.sharing(task, harness.Setting(workers=3), harness.Sharing(scale_momentum=True, **config),
                             dtype=F64)
    given = harness.sharing(task, GivenBeta(workers=3), harness.Sharing(**config), dtype=F64)
    plain = harness.sharing(task, harness.Setting(workers=3), harness.Sharing(**config), dtype=F64)
    np.testing.assert_array_equal(scaled.params, given.params)
    assert not np.array_equal(scaled.params, plain.params)
    assert scaled.replica_gap < 1e-12


@pytest.mark.parametrize(("optimizer", "lr"), [("sgd", 0.01), ("rmsprop", 1e-4)])
def test_scaled_momentum_with_sgd_is_each_worker_stepping_with_momentum_to_the_power_lr_scaled(
        optimizer: str, lr: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """With SGD (and RMSprop with momentum), scale_momentum is bit for bit the run whose workers were
    given momentum 0.9 ** 3 and the lr times (1 - 0.9 ** 3) / (1 - 0.9) (RMSprop's square average
    started at the first gradient's square); the drain still leaves every replica on the master copy."""
    from psrv.nn.momentum import lr_factor, start_square_averages

    task = tasks.make("tiny", epochs=2)
    config = dict(threshold=SampledQuantileThreshold, delay=1, own_point=True)
    scaled = harness.sharing(task, harness.Setting(optimizer=optimizer, workers=3),
                             harness.Sharing(scale_momentum=True, **config), dtype=F64)
    with monkeypatch.context() as patch:
        build = harness.network

        def started(*args, **kwargs):
            net = build(*args, **kwargs)
            start_square_averages(net.optimizer)  # nothing for SGD
            return net

        patch.setattr(harness, "network", started)
        given = harness.sharing(task, harness.Setting(optimizer=optimizer, workers=3, momentum=0.9 ** 3,
                                                      lr=lr * lr_factor(0.9, 3)),
                                harness.Sharing(**config), dtype=F64)
    plain = harness.sharing(task, harness.Setting(optimizer=optimizer, workers=3), harness.Sharing(**config),
                            dtype=F64)
    np.testing.assert_array_equal(scaled.params, given.params)
    assert not np.array_equal(scaled.params, plain.params)
    assert scaled.replica_gap < 1e-12
    # square_start=False (bench_quality's "zerostart"): torch's zero start, the given values' run as built
    zero = harness.sharing(task, harness.Setting(optimizer=optimizer, workers=3),
                           harness.Sharing(scale_momentum=True, square_start=False, **config), dtype=F64)
    built = harness.sharing(task, harness.Setting(optimizer=optimizer, workers=3, momentum=0.9 ** 3,
                                                  lr=lr * lr_factor(0.9, 3)),
                            harness.Sharing(**config), dtype=F64)
    np.testing.assert_array_equal(zero.params, built.params)
    assert np.array_equal(zero.params, scaled.params) == (optimizer == "sgd")


def test_every_method_sees_the_same_minibatches() -> None:
    task = tasks.make("tiny")
    one = [b for r in harness.batches(task, harness.Setting(workers=1)) for b in r]
    rounds = harness.batches(task, harness.Setting(workers=4))
    flat = [b for r in rounds for b in r]
    assert all(len(r) == 4 for r in rounds)
    for (x1, y1), (x2, y2) in zip(flat, one, strict=False):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_workers_splitting_one_process_batch_average_to_one_process_exactly() -> None:
    """At N workers on minibatches of b / N rows, a round covers one process's minibatch of b rows: the
    same rows in the same order, so synchronous averaging is one process (to rounding)."""
    task = tasks.make("tiny", epochs=2)
    one = harness.one_process(task, harness.Setting(optimizer="adam", workers=1), dtype=F64)
    split = tasks.make("tiny", epochs=2, batch_size=task.batch_size // 4)
    sync = harness.synchronous(split, harness.Setting(optimizer="adam", workers=4), dtype=F64)
    assert sync.steps == one.steps
    np.testing.assert_allclose(sync.params, one.params, rtol=1e-10, atol=1e-12)


def test_the_worker_batch_leaves_one_process_on_the_task_batch_and_names_its_rows() -> None:
    """``--worker-batch`` changes every method's minibatches but one process's, and the table groups
    those runs under their own name, beside their one process."""
    runs = {m: bench_quality._run(("tiny", "adam", 4, 0, m, 0, 0, 0, 0.0, False, 0.0, 2))
            for m in ("one", "sync", "default")}
    plain_one = bench_quality._run(("tiny", "adam", 1, 0, "one", 0, 0, 0))
    assert runs["one"]["steps"] == plain_one["steps"] == runs["sync"]["steps"] == runs["default"]["steps"]
    assert runs["one"]["curve"] == plain_one["curve"]
    assert runs["default"]["gap"] < 1e-6  # the replicas drain to the master copy
    rows = report.table(list(runs.values()), 0.97)[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| tiny, batch 2 per worker"] * 3
    assert rows[1].split(" | ")[5] == "+0.0"  # synchronous averaging over the split batch: one process


def test_local_steps_of_one_worker_without_quantization_are_the_plain_optimizer_over_the_pieces() -> None:
    """K local steps a message: the worker steps on each piece of its minibatch in turn and sends the
    sum, so one worker with the exact codec is the plain optimizer over the pieces (to rounding: the
    sum is added at once)."""
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="adam", workers=1)
    shared = harness.sharing(task, setting, harness.Sharing(codec="exact", local_steps=4), dtype=F64)
    pieces = tasks.make("tiny", epochs=2, batch_size=task.batch_size // 4)
    plain = _plain_loop(pieces, setting)
    np.testing.assert_allclose(shared.params, plain, rtol=1e-10, atol=1e-12)
    assert shared.steps * 4 == harness.one_process(pieces, setting, dtype=F64).steps
    assert not np.allclose(shared.params, _plain_loop(task, setting))  # not one step on the whole


def test_local_steps_keep_every_replica_on_the_master_copy() -> None:
    task = tasks.make("tiny", epochs=2)
    setting = harness.Setting(optimizer="adam", workers=3)
    config = harness.Sharing(SampledQuantileThreshold, delay=1, jitter=1, own_point=True, scale_momentum=True,
                             local_steps=2)
    result = harness.sharing(task, setting, config, dtype=F64)
    assert result.replica_gap < 1e-12
    one_step = harness.sharing(task, setting, harness.Sharing(SampledQuantileThreshold, delay=1, jitter=1,
                                                              own_point=True, scale_momentum=True), dtype=F64)
    assert not np.array_equal(result.params, one_step.params)


def test_exactdefault_is_the_default_stepping_with_every_update_whole() -> None:
    """bench_quality's ``exactdefault``, the control that tells the residual's share of a row: every
    update whole (a dense exchange, nothing left behind) with the default's momentum ** workers, so
    neither the plain ``exact`` run (momentum as given) nor the quantized default."""
    names = ("exactdefault", "exact", "default")
    runs = {m: bench_quality._run(("tiny", "sgd", 2, 0, m, 0, 0, 0)) for m in names}
    whole = runs["exactdefault"]
    assert whole["unpacked"] == whole["bytes"] == whole["dense"] * whole["steps"] * 2  # every update, dense
    assert whole["gap"] < 1e-6  # the replicas drain to the master copy
    assert runs["default"]["unpacked"] < whole["unpacked"] / 10  # the default quantizes
    assert whole["curve"] != runs["exact"]["curve"]  # the momentum is the default's, not the given one
    assert whole["curve"] != runs["default"]["curve"]


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



def test_epochs_given_on_the_command_line_replace_the_tasks_own_and_name_the_rows() -> None:
    default = bench_quality._run(("tiny", "adam", 2, 0, "sync", 0, 0, 0))
    longer = bench_quality._run(("tiny", "adam", 2, 0, "sync", 0, 0, 3))
    assert longer["steps"] == 3 * default["steps"] > 0
    one = bench_quality._run(("tiny", "adam", 1, 0, "one", 0, 0, 3))
    rows = [row.split(" | ")[:4] for row in report.table([one, longer], 0.5)[2:]]
    assert rows == [["| tiny, 3 epochs", "adam", "1", "one process"],
                    ["| tiny, 3 epochs", "adam", "2", "sync averaging (DDP)"]]
    delayed = {**longer, "job": ("tiny", "adam", 2, 0, "sync", 1, 2, 3)}
    assert report.table([delayed], 0.5)[2].startswith("| tiny, 3 epochs, delay 1+2 | adam | 2 |")


def test_the_sparsity_and_interleaving_of_a_run_reach_it_and_name_its_rows(monkeypatch) -> None:
    """``--sparsity`` changes the default method's τ (more elements sent: more bytes) and
    ``--interleave`` the harness's schedule; both name the rows they made."""
    schedules = []
    sharing = harness.sharing

    def recording(task, setting, config, *args, **kwargs):
        schedules.append(config.interleave)
        return sharing(task, setting, config, *args, **kwargs)

    monkeypatch.setattr(harness, "sharing", recording)
    base = ("tiny", "adam", 2, 0, "default", 0, 0, 0)
    plain = bench_quality._run(base)
    # a third of 0.24 of 75 elements is 6, where 0.03 gives the floor of 1
    denser = bench_quality._run((*base, 0.24))
    interleaved = bench_quality._run((*base, 0.0, True))
    assert denser["bytes"] > plain["bytes"] > 0
    assert schedules == [False, False, True]
    rows = [report.table([run], 0.5)[2].split(" | ")[0] for run in (plain, denser, interleaved)]
    assert rows == ["| tiny", "| tiny, sparsity 0.24", "| tiny, interleaved"]
    script = str(ROOT / "scripts" / "bench_quality.py")
    refused = subprocess.run([sys.executable, script, "--sparsity", "1.5"], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "--sparsity: sparsity must be in (0, 1), got 1.5" in refused.stderr


def test_sync_at_a_learning_rate_factor_is_synchronous_averaging_at_that_rate_beside_one_process() -> None:
    """``sync@K`` is synchronous averaging at K x the optimizer's learning rate, in the same group as
    one process at its own rate, so the table compares the two."""
    one = bench_quality._run(("tiny", "adam", 1, 0, "one", 0, 0, 0))
    plain = bench_quality._run(("tiny", "adam", 2, 0, "sync", 0, 0, 0))
    faster = bench_quality._run(("tiny", "adam", 2, 0, "sync@4", 0, 0, 0))
    direct = harness.synchronous(tasks.make("tiny", 0), harness.Setting(workers=2, seed=0, lr=4e-3))
    assert faster["curve"] == direct.curve and faster["accuracy"] == direct.accuracy
    assert faster["curve"] != plain["curve"]
    rows = [row.split(" | ") for row in report.table([one, plain, faster], 0.5)[2:]]
    assert [row[3] for row in rows] == ["one process", "sync averaging (DDP)", "sync averaging, lr x 4"]
    assert {row[0] for row in rows} == {"| tiny"}  # one group: "vs one process" is against one process
    assert rows[2][5] == f"{100 * (faster['accuracy'] - one['accuracy']):+.1f}"
    with pytest.raises(ValueError, match="positive number"):
        methods.sync_factor("sync@-2")


def test_a_learning_rate_scale_reaches_every_method_and_names_its_rows() -> None:
    """``--lr-scale`` runs one process and the others at F x the optimizer's rate; its rows are named
    apart, so they are compared only with runs at the same rate."""
    one = bench_quality._run(("tiny", "sgd", 1, 0, "one", 0, 0, 0, 0.0, False, 2.0))
    direct = harness.one_process(tasks.make("tiny", 0), harness.Setting(optimizer="sgd", workers=1, seed=0,
                                                                           lr=0.02))
    assert one["curve"] == direct.curve
    assert one["curve"] != bench_quality._run(("tiny", "sgd", 1, 0, "one", 0, 0, 0))["curve"]
    sharing = bench_quality._run(("tiny", "sgd", 2, 0, "default", 0, 0, 0, 0.0, False, 2.0))
    rows = [row.split(" | ")[:4] for row in report.table([one, sharing], 0.5)[2:]]
    assert rows == [["| tiny, lr x 2", "sgd", "1", "one process"],
                    ["| tiny, lr x 2", "sgd", "2", methods.label("default")]]
    script = str(ROOT / "scripts" / "bench_quality.py")
    refused = subprocess.run([sys.executable, script, "--lr-scale", "0"], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "--lr-scale: expected a positive number, got 0.0" in refused.stderr


def test_the_harness_default_takes_the_local_steps_the_master_chooses() -> None:
    """bench_quality's "default" is the shipped default, ``local_steps="auto"`` included: the product's own
    rule, asked of the task's network, so the aims table measures what users get."""
    def run(method: str, optimizer: str = "adam", rows: int = 16, workers: int = 2) -> list:
        job = ("tiny", optimizer, workers, 0, method, 0, 0, 0, 0.0, False, 0.0, rows)
        return bench_quality._run(job)["curve"]

    assert run("default") == run("local2")  # Adam on 16 rows: two steps a message
    assert run("default") != run("onestep")
    assert run("default", rows=8) == run("onestep", rows=8)  # pieces of 4 rows: one step
    assert run("default", "rmsprop") == run("local2", "rmsprop")
    assert run("default", "sgd") == run("local2", "sgd")  # SGD: two up to 4 workers side by side ...
    assert run("default", "sgd", workers=8) == run("onestep", "sgd", workers=8)  # ... and one at 8


def test_a_message_every_few_rounds_loses_nothing_and_keeps_every_replica_on_the_master_copy() -> None:
    """A message every K rounds: the steps between wait in the residual. One worker's master copy plus its
    residual is still the plain optimizer's parameters; with three workers, delay and jitter, every
    replica drains to the master copy, and fewer rounds send than with a message each round."""
    task = tasks.make("tiny", epochs=2)
    one = harness.Setting(optimizer="adam", workers=1)
    config = harness.Sharing(lambda: FixedThreshold(1e-3), NoResidualPostProcessor, own_point=True,
                             message_period=3)
    shared = harness.sharing(task, one, config, dtype=F64)
    plain = _plain_loop(task, one)
    np.testing.assert_allclose(shared.params + shared.residuals[0], plain, rtol=0, atol=1e-12)
    every = harness.sharing(task, one, harness.Sharing(lambda: FixedThreshold(1e-3), NoResidualPostProcessor,
                                                       own_point=True), dtype=F64)
    assert 0 < shared.bytes_total < every.bytes_total

    three = harness.Setting(optimizer="adam", workers=3)
    result = harness.sharing(task, three, harness.Sharing(SampledQuantileThreshold, delay=1, jitter=1,
                                                          own_point=True, message_period=2), dtype=F64)
    assert result.replica_gap < 1e-12 and result.bytes_total > 0
    with pytest.raises(ValueError, match="own_point"):
        harness.sharing(task, three, harness.Sharing(SampledQuantileThreshold, message_period=2), dtype=F64)
