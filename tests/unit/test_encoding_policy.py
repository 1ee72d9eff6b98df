"""psrv.encoding policy objects: threshold schedules, residual clipping, debug stats and ResidualEncoder."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.encoding import (
    AdaptiveThreshold,
    EncodingStats,
    FixedThreshold,
    InvalidStateError,
    NonFiniteResidualError,
    NoResidualPostProcessor,
    ResidualClipping,
    ResidualEncoder,
    SampledQuantileThreshold,
    TargetSparsityThreshold,
    decode,
    encoding_stats,
    message_info,
    post_processor_from_state,
    threshold_algorithm_from_state,
)
from psrv.encoding.thresholds import MIN_THRESHOLD

DECAY = 0.5 ** (1 / 20)

# ---------------------------------------------------------------- threshold algorithms


def test_adaptive_defaults_follow_dl4j() -> None:
    a = AdaptiveThreshold()
    assert (a.threshold, a.min_sparsity, a.max_sparsity) == (1e-4, 1e-4, 1e-2)
    assert a.decay == pytest.approx(DECAY)


def test_adaptive_schedule_moves_tau_to_keep_sparsity_in_range() -> None:
    a = AdaptiveThreshold(initial=1e-3)
    a.observe(0, 10_000)  # sparsity 0 < 1e-4: lower tau so more passes
    assert a.threshold == pytest.approx(1e-3 * DECAY)
    a.observe(500, 10_000)  # 5e-2 > 1e-2: raise tau
    assert a.threshold == pytest.approx(1e-3)
    a.observe(50, 10_000)  # 5e-3 is inside the range: keep
    a.observe(1, 10_000)  # exactly 1e-4, the bound itself, is inside
    a.observe(100, 10_000)  # exactly 1e-2 is inside
    assert a.threshold == pytest.approx(1e-3)
    for _ in range(20):
        a.observe(0, 10_000)
    assert a.threshold == pytest.approx(0.5e-3, rel=1e-12)  # 20 steps halve tau
    for _ in range(40):
        a.observe(10_000, 10_000)
    assert a.threshold == pytest.approx(2e-3, rel=1e-12)
    a.observe(0, 0)  # an empty vector tells nothing
    assert a.threshold == pytest.approx(2e-3, rel=1e-12)


def test_target_sparsity_schedule() -> None:
    t = TargetSparsityThreshold(initial=1e-2, target=1e-3)
    t.observe(0, 1000)
    assert t.threshold == pytest.approx(1e-2 * DECAY)
    t.observe(2, 1000)
    assert t.threshold == pytest.approx(1e-2)
    t.observe(1, 1000)  # on target
    assert t.threshold == pytest.approx(1e-2)


def test_fixed_threshold_never_moves() -> None:
    f = FixedThreshold(0.25)
    for count in (0, 1, 1000):
        f.observe(count, 1000)
    assert f.threshold == 0.25


def test_tau_stays_a_usable_float32_after_endless_silence() -> None:
    a = AdaptiveThreshold(initial=1e-20)
    for _ in range(3000):
        a.observe(0, 100)
    assert a.threshold == MIN_THRESHOLD
    assert np.float32(a.threshold) > 0


@pytest.mark.parametrize("make", [
    lambda: AdaptiveThreshold(min_sparsity=0.1, max_sparsity=0.01),
    lambda: AdaptiveThreshold(decay=1.0),
    lambda: AdaptiveThreshold(initial=0),
    lambda: AdaptiveThreshold(initial=float("nan")),
    lambda: TargetSparsityThreshold(target=2.0),
    lambda: TargetSparsityThreshold(decay=1.5),
    lambda: FixedThreshold(-1.0),
])
def test_bad_settings_are_rejected(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_observe_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        AdaptiveThreshold().observe(11, 10)
    with pytest.raises(ValueError):
        FixedThreshold(1.0).observe(-1, 10)


ALGORITHMS = [
    lambda: FixedThreshold(0.125),
    lambda: AdaptiveThreshold(initial=3e-4, min_sparsity=1e-3, max_sparsity=5e-2, decay=0.9),
    lambda: TargetSparsityThreshold(initial=2e-3, target=1e-2, decay=0.8),
]


@pytest.mark.parametrize("make", ALGORITHMS)
def test_state_round_trips_through_json_and_msgpack(make) -> None:
    algorithm = make()
    algorithm.observe(0, 1000)
    algorithm.observe(0, 1000)
    state = algorithm.get_state()
    assert state["type"] == type(algorithm).__name__
    for restored_state in (json.loads(json.dumps(state)), msgpack.unpackb(msgpack.packb(state))):
        restored = threshold_algorithm_from_state(restored_state)
        original = threshold_algorithm_from_state(state)
        assert type(restored) is type(algorithm)
        assert restored == algorithm
        assert restored.threshold == algorithm.threshold
        restored.observe(0, 1000)
        original.observe(0, 1000)
        assert restored.threshold == original.threshold  # the schedule continues where it was


@pytest.mark.parametrize("make", ALGORITHMS)
def test_average_takes_the_mean_threshold(make) -> None:
    workers = [make() for _ in range(3)]
    for i, w in enumerate(workers):
        for _ in range(i * 5):
            w.observe(0, 1000)
    cls = type(workers[0])
    averaged = cls.average([w.get_state() for w in workers])
    assert type(averaged) is cls
    assert averaged.threshold == pytest.approx(np.mean([w.threshold for w in workers]))
    assert cls.average(workers).threshold == averaged.threshold  # instances work too


def test_average_refuses_mixed_settings_and_empty_input() -> None:
    with pytest.raises(InvalidStateError, match="different settings"):
        AdaptiveThreshold.average([AdaptiveThreshold().get_state(), AdaptiveThreshold(decay=0.9).get_state()])
    with pytest.raises(InvalidStateError):
        AdaptiveThreshold.average([])
    with pytest.raises(InvalidStateError):
        AdaptiveThreshold.average([FixedThreshold(1.0).get_state()])


@pytest.mark.parametrize("state", [
    {"type": "NoSuchAlgorithm"},
    {"tau": 1.0},
    {"type": "FixedThreshold"},
    {"type": "FixedThreshold", "tau": 1.0, "threshold": -5.0},
    {"type": "AdaptiveThreshold", "initial": 1e-4, "min_sparsity": 1e-4, "max_sparsity": 1e-2},
    "FixedThreshold",
])
def test_bad_states_are_rejected(state) -> None:
    with pytest.raises(InvalidStateError):
        threshold_algorithm_from_state(state)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.just(1000)), max_size=60))
def test_adaptive_threshold_moves_by_one_factor_per_step_at_most(observations) -> None:
    a = AdaptiveThreshold(initial=1e-3)
    for count, n in observations:
        before = a.threshold
        a.observe(count, n)
        sparsity = count / n
        if sparsity < a.min_sparsity:
            assert a.threshold == pytest.approx(before * DECAY)
        elif sparsity > a.max_sparsity:
            assert a.threshold == pytest.approx(before / DECAY)
        else:
            assert a.threshold == before


# ---------------------------------------------------------------- residual post-processing

def test_clipping_acts_on_every_fifth_step_only() -> None:
    clip = ResidualClipping()
    assert (clip.multiple, clip.every) == (5.0, 5)
    tau = 0.1
    limit = np.float32(5.0 * float(np.float32(tau)))
    big = np.array([10.0, -10.0, 0.3, -0.3], dtype=np.float32)
    for step in range(1, 11):
        residual = big.copy()
        clip.process(residual, tau)
        if step % 5:
            np.testing.assert_array_equal(residual, big)
        else:
            np.testing.assert_array_equal(residual, np.array([limit, -limit, 0.3, -0.3], dtype=np.float32))


def test_clipping_state_round_trip_keeps_the_step_count() -> None:
    clip = ResidualClipping(multiple=2.0, every=3)
    for _ in range(2):
        clip.process(np.zeros(3, dtype=np.float32), 1.0)
    restored = post_processor_from_state(msgpack.unpackb(msgpack.packb(clip.get_state())))
    residual = np.array([7.0], dtype=np.float32)
    restored.process(residual, 1.0)  # third step: clips
    assert residual[0] == 2.0
    none = post_processor_from_state(NoResidualPostProcessor().get_state())
    assert isinstance(none, NoResidualPostProcessor)
    with pytest.raises(InvalidStateError):
        post_processor_from_state({"type": "Sharpen"})


def test_no_post_processor_changes_nothing() -> None:
    residual = np.array([100.0, -100.0])
    for _ in range(10):
        NoResidualPostProcessor().process(residual, 0.01)
    np.testing.assert_array_equal(residual, [100.0, -100.0])


@pytest.mark.parametrize("kwargs", [{"multiple": 0}, {"multiple": float("inf")}, {"every": 0},
                                    {"every": 2.5}])
def test_clipping_rejects_bad_settings(kwargs) -> None:
    with pytest.raises(ValueError):
        ResidualClipping(**kwargs)


# ---------------------------------------------------------------- debug statistics

def test_encoding_stats_of_a_known_vector() -> None:
    residual = np.array([0.0, 0.5, -1.0, 2.0, -4.0] * 20, dtype=np.float32)
    stats = encoding_stats(residual, 1.0)
    assert isinstance(stats, EncodingStats)
    assert (stats.tau, stats.n, stats.count) == (1.0, 100, 60)
    assert stats.sparsity == pytest.approx(0.6)
    assert stats.mean_abs == pytest.approx(1.5)
    assert stats.max_abs == 4.0
    expected = np.percentile(np.abs(residual.astype(np.float64)), [50, 95, 99, 99.9])
    assert list(stats.percentiles) == [50.0, 95.0, 99.0, 99.9]
    np.testing.assert_allclose(list(stats.percentiles.values()), expected)
    np.testing.assert_allclose(list(stats.percentiles_in_tau.values()), expected / 1.0)
    json.dumps(stats.to_dict())
    assert "sparsity=0.6" in str(stats)


def test_encoding_stats_in_multiples_of_the_float32_tau() -> None:
    stats = encoding_stats(np.full(10, 0.3, dtype=np.float32), 0.1)
    tau = float(np.float32(0.1))
    assert stats.tau == tau
    assert stats.percentiles_in_tau[50.0] == pytest.approx(float(np.float32(0.3)) / tau)
    assert encoding_stats(np.zeros(0, dtype=np.float32), 0.1).count == 0


# ---------------------------------------------------------------- ResidualEncoder

def test_residual_encoder_defaults() -> None:
    encoder = ResidualEncoder(10)
    assert encoder.residual.dtype == np.float32 and encoder.residual.shape == (10,)
    assert isinstance(encoder.threshold_algorithm, SampledQuantileThreshold)
    assert isinstance(encoder.post_processor, ResidualClipping)
    assert encoder.last_stats is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_what_was_sent_plus_the_residual_is_what_was_added(dtype) -> None:
    rng = np.random.default_rng(3)
    n = 500
    encoder = ResidualEncoder(n, dtype=dtype, threshold_algorithm=FixedThreshold(0.05),
                              post_processor=NoResidualPostProcessor())
    sent = np.zeros(n, dtype=np.float64)
    total = np.zeros(n, dtype=np.float64)
    messages = 0
    for _ in range(30):
        update = (rng.standard_normal(n) * 0.02).astype(dtype)
        total += update
        message = encoder.encode_update(update)
        if message is not None:
            messages += 1
            decode(message, sent)
    assert messages > 0
    np.testing.assert_allclose(sent + encoder.residual, total, atol=1e-4)
    assert np.all(np.abs(encoder.residual) < 0.05 + 0.02 * 8)


def test_residual_encoder_feeds_the_algorithm_the_emitted_count() -> None:
    rng = np.random.default_rng(5)
    n = 2000
    encoder = ResidualEncoder(n, threshold_algorithm=AdaptiveThreshold(initial=1e-2), debug=True)
    shadow = AdaptiveThreshold(initial=1e-2)
    for _ in range(12):
        tau = encoder.threshold_algorithm.threshold
        assert tau == shadow.threshold
        message = encoder.encode_update(rng.standard_normal(n).astype(np.float32) * 1e-3)
        count = 0 if message is None else message_info(message).count
        assert encoder.last_stats.count == count and encoder.last_stats.tau == float(np.float32(tau))
        shadow.observe(count, n)
    assert encoder.threshold_algorithm.threshold != 1e-2
    assert encoder.steps == 12


def test_residual_encoder_applies_clipping_after_encoding() -> None:
    encoder = ResidualEncoder(3, threshold_algorithm=FixedThreshold(1.0),
                              post_processor=ResidualClipping(multiple=5.0, every=1))
    message = encoder.encode_update(np.array([100.0, 0.5, -100.0], dtype=np.float32))
    assert message_info(message).count == 2
    np.testing.assert_array_equal(encoder.residual, [5.0, 0.5, -5.0])


def test_residual_encoder_rejects_bad_updates_and_reports_non_finite() -> None:
    encoder = ResidualEncoder(4, threshold_algorithm=FixedThreshold(1.0))
    with pytest.raises(ValueError, match="shape"):
        encoder.encode_update(np.zeros(5, dtype=np.float32))
    with pytest.raises(TypeError):
        encoder.encode_update(np.zeros(4, dtype=np.int32))
    with pytest.raises(NonFiniteResidualError) as caught:
        encoder.encode_update(np.array([0, 0, np.nan, 0], dtype=np.float32))
    assert caught.value.index == 2
    with pytest.raises(ValueError):
        ResidualEncoder(-1)
    with pytest.raises(TypeError):
        ResidualEncoder(3, dtype=np.int16)


def test_residual_encoder_returns_none_until_something_reaches_tau_and_resets() -> None:
    encoder = ResidualEncoder(8, threshold_algorithm=FixedThreshold(1.0),
                              post_processor=NoResidualPostProcessor())
    update = np.full(8, 0.3, dtype=np.float32)
    assert encoder.encode_update(update) is None
    assert encoder.encode_update(update) is None
    assert encoder.encode_update(update) is None
    message = encoder.encode_update(update)  # 1.2 >= 1
    assert message_info(message).count == 8
    encoder.reset()
    assert not encoder.residual.any()
