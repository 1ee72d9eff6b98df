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
    compact,
    encode,
    message_info,
    shared_training_threshold,
    threshold_algorithm_from_state,
)
from psrv.encoding.thresholds import describe_threshold
from psrv.encoding.update_header import packed_message_bytes_bound
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
          SampledQuantileThreshold(warmup=7, warmup_sparsity=0.2), shared_training_threshold()]


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


def test_the_packed_bound_holds_for_any_set_of_elements() -> None:
    """``packed_message_bytes_bound`` is never below what ``compact`` makes of a message: clustered,
    spread and random index sets, small and large vectors; it grows with the count."""
    rng = np.random.default_rng(11)
    for n in (1, 17, 300, 788, 5000, 100_000):
        for count in sorted({1, 2, max(1, n // 100), max(1, n // 30), max(1, n // 3), n}):
            count = min(count, n)
            layouts = [np.arange(count), np.arange(n - count, n),
                       np.linspace(0, n - 1, count).astype(np.int64),
                       np.sort(rng.choice(n, size=count, replace=False))]
            bound = packed_message_bytes_bound(count, n)
            for indices in layouts:
                residual = np.zeros(n, np.float32)  # the encoder picks the sparse or the bitmap form
                residual[indices] = np.where(rng.random(count) < 0.5, -1.0, 1.0)
                message = encode(residual, 0.5)
                assert message_info(message).count == count
                assert compact(message).nbytes <= bound, (n, count)
        counts = range(1, min(n, 400) + 1)
        assert all(packed_message_bytes_bound(a, n) <= packed_message_bytes_bound(a + 1, n)
                   for a in counts[:-1])


def _messages(n: int, threshold_algorithm, steps: int = 40, seed: int = 5) -> list[np.ndarray]:
    """The compacted messages of ``steps`` random steps of ``n`` elements, through the encoder's
    plain, fused-difference and implicit-residual paths in turn."""
    rng = np.random.default_rng(seed)
    encoder = ResidualEncoder(n, threshold_algorithm=threshold_algorithm)
    live, step = np.zeros(n, np.float32), np.zeros(n, np.float32)
    out = []
    for i in range(steps):
        update = (1e-3 * rng.normal(size=n)).astype(np.float32)
        if i % 3 == 0:
            message = encoder.encode_update(update)
        elif i % 3 == 1:
            before = rng.normal(size=n).astype(np.float32)
            message = encoder.encode_difference(before + update, before)
        else:
            step += update
            message = encoder.encode_gap(step, live)
        out.append(compact(message))
    return out


def test_a_byte_budget_keeps_a_small_models_messages_within_it_and_leaves_larger_ones_alone() -> None:
    """The shared-training default on a model of 788 parameters: 9 elements a message, none over 1 %
    of the dense 3,152 bytes, where 3 % alone sends 24 and 40 bytes; on 20,000 parameters the budget
    does not bind and the messages are the unbudgeted ones, byte for byte."""
    budgeted = _messages(788, shared_training_threshold())
    plain = _messages(788, SampledQuantileThreshold(sparsity=0.03))
    assert [message_info(m).count for m in budgeted] == [9] * 40
    assert max(m.nbytes for m in budgeted) <= 0.01 * 4 * 788
    assert [message_info(m).count for m in plain] == [24] * 40
    assert min(m.nbytes for m in plain) > 0.01 * 4 * 788
    assert shared_training_threshold().budget_elements(788) == 9
    large = _messages(20_000, shared_training_threshold(), steps=12)
    unbudgeted = _messages(20_000, SampledQuantileThreshold(sparsity=0.03), steps=12)
    assert [m.tobytes() for m in large] == [m.tobytes() for m in unbudgeted]
    assert SampledQuantileThreshold(sparsity=0.03).budget_elements(788) is None


def test_a_byte_budget_leaves_at_least_a_third_of_the_elements() -> None:
    """Below about 700 parameters 1 % of a dense update holds a handful of elements or none: the
    budget then gives way to a third of ``sparsity``'s elements rather than starve every message."""
    assert shared_training_threshold().budget_elements(300) == 1
    assert [message_info(m).count for m in _messages(300, shared_training_threshold(), steps=6)] == [3] * 6
    assert [message_info(m).count for m in _messages(300, SampledQuantileThreshold(0.03), steps=6)] == [9] * 6


def test_the_rule_the_driver_logs_says_what_a_message_carries_and_where_the_budget_binds() -> None:
    """The rule's counts are those the encoder sends: 3 % within the budget, the budget's count where
    it binds, and the floor where even that is exceeded (with the bytes a message may take)."""
    default = shared_training_threshold()
    assert default.message_rule(20_000).endswith(
        ": about 600 of 20,000 elements a message, within 0.01 of a dense update's 80,000 bytes")
    assert default.message_rule(788).endswith(
        "fewer to stay within 0.01 of a dense update's 3,152 bytes: about 9 of 788 elements a message, "
        "where 0.03 would be 24")
    small = default.message_rule(300)
    assert "about 3 of 300 elements a message, a third of 9" in small
    assert small.endswith(f"may take up to {packed_message_bytes_bound(3, 300)} bytes, over 0.01 of a dense "
                          "update's 1,200 bytes (12 bytes)")
    for n, count in ((788, 9), (300, 3)):  # what the rule says is what is sent
        assert message_info(_messages(n, shared_training_threshold(), steps=1)[0]).count == count
    assert SampledQuantileThreshold(sparsity=0.03).message_rule(788).endswith(
        ": about 24 of 788 elements a message")
    adaptive = AdaptiveThreshold(1e-3)
    assert describe_threshold(adaptive, 788) == repr(adaptive)  # no rule of its own: its settings
    assert describe_threshold(default, 788) == default.message_rule(788)


def test_a_byte_budget_round_trips_and_bad_budgets_are_refused() -> None:
    algorithm = shared_training_threshold()
    algorithm.prepare(np.random.default_rng(2).normal(size=788).astype(np.float32))
    state = algorithm.get_state()
    assert state["byte_budget"] == 0.01 and state["sparsity"] == 0.03
    for copied in (json.loads(json.dumps(state)), msgpack.unpackb(msgpack.packb(state))):
        restored = threshold_algorithm_from_state(copied)
        assert restored == algorithm and restored.threshold == algorithm.threshold and restored.steps == 1
    old = {k: v for k, v in state.items() if k != "byte_budget"}  # saved before the budget existed
    assert threshold_algorithm_from_state(old).byte_budget is None
    with pytest.raises(InvalidStateError, match="different settings"):
        SampledQuantileThreshold.average([algorithm, SampledQuantileThreshold(sparsity=0.03)])
    for bad in (0, -0.01, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="byte_budget"):
            SampledQuantileThreshold(byte_budget=bad)
        with pytest.raises(InvalidStateError, match="byte_budget"):
            threshold_algorithm_from_state({**state, "byte_budget": bad})
