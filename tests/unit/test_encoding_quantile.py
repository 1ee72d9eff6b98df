"""SampledQuantileThreshold: tau taken from the residual each step, its state, and what it sends."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest
from psrv.encoding import (
    AdaptiveThreshold,
    InvalidStateError,
    ResidualClipping,
    ResidualEncoder,
    SampledQuantileThreshold,
    message_info,
    threshold_algorithm_from_state,
)
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark.driver import checkpoints


def test_tau_is_the_sampled_quantile_of_the_residual() -> None:
    residual = np.arange(1, 1001, dtype=np.float32) * np.where(np.arange(1000) % 2, -1, 1).astype(np.float32)
    algorithm = SampledQuantileThreshold(sparsity=0.01, sample=1000)
    algorithm.prepare(residual)
    assert algorithm.threshold == 991.0  # the 10th largest |r|: exactly 10 elements reach it
    strided = SampledQuantileThreshold(sparsity=0.01, sample=100)  # every 10th element: 1, 11, ... 991
    strided.prepare(residual)
    assert strided.threshold == 991.0  # the largest of 100 sampled
    before = algorithm.threshold
    algorithm.prepare(np.zeros(50, dtype=np.float32))  # nothing to go by: tau stays
    algorithm.prepare(np.zeros(0, dtype=np.float32))
    assert algorithm.threshold == before


def test_torch_residual_gives_the_numpy_tau() -> None:
    torch = pytest.importorskip("torch")
    residual = np.random.default_rng(3).normal(size=5000).astype(np.float32)
    on_host, on_tensor = (SampledQuantileThreshold(3e-3, sample=512) for _ in range(2))
    on_host.prepare(residual)
    on_tensor.prepare(torch.from_numpy(residual))
    assert on_tensor.threshold == on_host.threshold


def test_adam_like_first_steps_send_no_dense_bitmap() -> None:
    """Uniform steps of about lr on every element (Adam's first steps) pass any fixed tau together;
    the sampled tau keeps every message near the target sparsity, from the first step on."""
    n, rng = 200_000, np.random.default_rng(0)
    encoder = ResidualEncoder(n, threshold_algorithm=SampledQuantileThreshold(sparsity=4e-3))
    dl4j = ResidualEncoder(n, threshold_algorithm=AdaptiveThreshold(1e-3))
    forms, counts, dl4j_forms = [], [], []
    for _ in range(60):
        update = (1e-3 * np.sign(rng.normal(size=n)) * (1 - 1e-3 * rng.random(n))).astype(np.float32)
        message = encoder.encode_update(update)
        info = message_info(message)
        forms.append(info.form)
        counts.append(info.count)
        dl4j_message = dl4j.encode_update(update)
        if dl4j_message is not None:
            dl4j_forms.append(message_info(dl4j_message).form)
    assert forms == ["sparse"] * 60
    assert all(0.5 * 4e-3 * n <= c <= 2 * 4e-3 * n for c in counts), counts
    assert "bitmap" in dl4j_forms  # the adaptive start this replaces


STATES = [SampledQuantileThreshold(), SampledQuantileThreshold(sparsity=1e-2, sample=4096, initial=0.5),
          SampledQuantileThreshold(warmup=7, warmup_sparsity=0.2)]


@pytest.mark.parametrize("algorithm", STATES)
def test_state_round_trips_exactly(algorithm) -> None:
    algorithm.prepare(np.random.default_rng(1).normal(size=3000).astype(np.float32))
    state = algorithm.get_state()
    for copied in (json.loads(json.dumps(state)), msgpack.unpackb(msgpack.packb(state))):
        restored = threshold_algorithm_from_state(copied)
        assert type(restored) is SampledQuantileThreshold
        assert restored == algorithm and restored.get_state() == state
        assert restored.threshold == algorithm.threshold
        assert restored.steps == algorithm.steps == 1


def test_average_and_bad_settings() -> None:
    workers = [SampledQuantileThreshold() for _ in range(2)]
    workers[0].prepare(np.full(100, 1e-3, dtype=np.float32))
    workers[1].prepare(np.full(100, 3e-3, dtype=np.float32))
    assert SampledQuantileThreshold.average([w.get_state() for w in workers]).threshold == pytest.approx(2e-3)
    with pytest.raises(InvalidStateError, match="different settings"):
        SampledQuantileThreshold.average([SampledQuantileThreshold(), SampledQuantileThreshold(1e-2)])
    for kwargs in ({"sparsity": 0}, {"sparsity": 1.0}, {"sample": 8}, {"sample": 1.5}, {"initial": -1}):
        with pytest.raises(ValueError):
            SampledQuantileThreshold(**kwargs)
    with pytest.raises(InvalidStateError):
        threshold_algorithm_from_state({"type": "SampledQuantileThreshold", "sparsity": 1e-3})


def test_checkpoint_resume_restores_the_state_exactly(tmp_path) -> None:
    """What ``fit(..., resume=True)`` reads back: the master's threshold state, through msgpack."""
    net = Network([Dense(4), Output(2)], input_shape=(3,), updater=Adam(1e-2), seed=1)
    algorithm = SampledQuantileThreshold(sparsity=2e-3, sample=1024, warmup=5)
    algorithm.prepare(np.random.default_rng(2).normal(size=5000).astype(np.float32))
    saved_master = type("M", (), {"threshold_algorithm": algorithm})()
    checkpoints.save(None, str(tmp_path / "ck"), net, saved_master, 1, [(1, {"loss": 1.0})])
    master = type("M", (), {"threshold_algorithm": AdaptiveThreshold(1e-3)})()
    checkpoints.load_newest(None, str(tmp_path / "ck"), net, master)
    assert master.threshold_algorithm == algorithm
    assert master.threshold_algorithm.get_state() == algorithm.get_state()


def test_residual_encoder_with_the_quantile_threshold_starts_from_the_residual() -> None:
    encoder = ResidualEncoder(1000, threshold_algorithm=SampledQuantileThreshold())
    assert isinstance(encoder.post_processor, ResidualClipping)
    update = np.full(1000, 0.5, dtype=np.float32)
    update[:3] = 7.0
    message = encoder.encode_update(update)
    assert message_info(message).count == 3  # 9e-3 of 1000 is 9, but the 9th largest ties with 991 more
    np.testing.assert_array_equal(encoder.residual[3:], update[3:])


def test_warmup_ramps_the_sent_fraction_down_and_resumes_where_it_was() -> None:
    """The warm-up sends warmup_sparsity first and sparsity from step ``warmup`` on, falling in
    between; a copy restored from the state mid-ramp picks exactly the taus the original picks."""
    n, rng = 20_000, np.random.default_rng(4)
    residuals = [rng.normal(size=n).astype(np.float32) for _ in range(8)]
    algorithm = SampledQuantileThreshold(sparsity=1e-2, sample=n, warmup=4, warmup_sparsity=0.2)
    fractions = []
    for residual in residuals[:3]:
        algorithm.prepare(residual)
        fractions.append(np.count_nonzero(np.abs(residual) >= algorithm.threshold) / n)
    restored = threshold_algorithm_from_state(msgpack.unpackb(msgpack.packb(algorithm.get_state())))
    for residual in residuals[3:]:
        algorithm.prepare(residual)
        restored.prepare(residual)
        assert restored.threshold == algorithm.threshold and restored.steps == algorithm.steps
        fractions.append(np.count_nonzero(np.abs(residual) >= algorithm.threshold) / n)
    assert fractions[0] == pytest.approx(0.2, rel=1e-3)
    assert all(a > b for a, b in zip(fractions[:4], fractions[1:5], strict=True)), fractions
    assert fractions[4:] == [pytest.approx(1e-2, rel=1e-2)] * 4
    averaged = SampledQuantileThreshold.average([algorithm.get_state(), restored.get_state(),
                                                 SampledQuantileThreshold.from_state(
                                                     {**algorithm.get_state(), "steps": 2})])
    assert averaged.steps == 8  # the furthest worker: a resumed fit does not warm up again
    old = {k: v for k, v in SampledQuantileThreshold().get_state().items()
           if k not in ("warmup", "warmup_sparsity", "steps")}
    assert threshold_algorithm_from_state(old) == SampledQuantileThreshold()  # saved before the warm-up
    for kwargs in ({"warmup": -1}, {"warmup": 2.0}, {"warmup_sparsity": 1.0},
                   {"sparsity": 0.2, "warmup_sparsity": 0.1, "warmup": 5}):
        with pytest.raises(ValueError):
            SampledQuantileThreshold(**kwargs)
    assert SampledQuantileThreshold(sparsity=0.2).current_sparsity() == 0.2  # no warm-up: 0.1 unused


def test_for_steps_sends_one_over_the_run_length_within_its_bounds_and_round_trips() -> None:
    """Latency-aware sparsity: 1/steps of the elements per message, never below ``sparsity`` nor above
    1/16; what it builds is a plain SampledQuantileThreshold, restored exactly from its state."""
    assert SampledQuantileThreshold.for_steps(40).sparsity == pytest.approx(1 / 40)
    assert SampledQuantileThreshold.for_steps(10_000).sparsity == 9e-3
    assert SampledQuantileThreshold.for_steps(400, sparsity=1e-3).sparsity == 1 / 400
    assert SampledQuantileThreshold.for_steps(3).sparsity == 1 / 16
    algorithm = SampledQuantileThreshold.for_steps(20, sample=4096, warmup=3)
    assert algorithm.warmup_sparsity == 0.1 and algorithm.warmup == 3
    residual = np.random.default_rng(6).normal(size=20_000).astype(np.float32)
    algorithm.prepare(residual)
    sent = np.count_nonzero(np.abs(residual) >= algorithm.threshold) / residual.size
    assert sent == pytest.approx(0.1, rel=0.1)  # the warm-up's first step
    restored = threshold_algorithm_from_state(msgpack.unpackb(msgpack.packb(algorithm.get_state())))
    assert restored == algorithm and restored.steps == 1
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="steps"):
            SampledQuantileThreshold.for_steps(bad)
