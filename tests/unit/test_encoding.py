"""psrv.encoding codec: encode, decode and message_info against a NumPy reference; threads, non-finite
residuals and bad arguments (malformed messages: test_encoding_messages.py)."""

from __future__ import annotations

import numpy as np
import pytest
from encoding_reference import ReferenceNonFinite, reference_decode, reference_encode, tau_bits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from psrv.encoding import (
    MessageInfo,
    NonFiniteResidualError,
    decode,
    encode,
    encode_counted,
    message_info,
)
from psrv.encoding import codec as codec_module

FLOATS = (np.float32, np.float64)
THRESHOLDS = (1e-3, 0.25, 1.0, 3e-7, 7.5)
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def uint_view(x: np.ndarray) -> np.ndarray:
    """Bitwise view, so comparisons see -0.0 vs 0.0 and every last bit."""
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


@st.composite
def residuals(draw, min_size: int = 0, max_size: int = 300):
    """A residual and a threshold: values cluster around +-tau so both sides of the rule are exercised."""
    dtype = draw(st.sampled_from(FLOATS))
    tau = draw(st.sampled_from(THRESHOLDS))
    edges = [v for v in (1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 65, 255, 256, 1023, 1024, 1025)
             if min_size <= v <= max_size]
    n = draw(st.one_of(st.integers(min_size, max_size), st.sampled_from(edges)))
    multiples = st.one_of(
        st.sampled_from([0.0, 1.0, -1.0, 0.9999999, -0.9999999, 1.0000001, 2.0, -3.5, 0.5]),
        st.floats(-4.0, 4.0, width=32),
        st.floats(-1e6, 1e6, width=32),
    )
    factors = draw(hnp.arrays(np.float64, n, elements=multiples))
    density = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]))
    mask = draw(hnp.arrays(np.float64, n, elements=st.floats(0, 1))) < density
    x = np.where(mask, factors * tau, factors * tau * 1e-3).astype(dtype)
    return x, tau


def expected_delta(x: np.ndarray, tau: float) -> np.ndarray:
    t = x.dtype.type(np.float32(tau))
    return np.where(x >= t, t, np.where(x <= -t, -t, x.dtype.type(0)))


# ---------------------------------------------------------------- the worked example and fixed cases

def test_worked_example_from_the_issue() -> None:
    x = np.array([0, -6e-4, 1e-3, -1e-3, 0, 0], dtype=np.float32)
    message = encode(x, 1e-3)
    assert message is not None and message.dtype == np.int32
    assert message.tolist() == [6, 6, tau_bits(np.float32(1e-3)), 1, 524300]
    np.testing.assert_array_equal(x, np.array([0, -6e-4, 0, 0, 0, 0], dtype=np.float32))
    target = np.zeros(6, dtype=np.float32)
    decode(message, target)
    t = np.float32(1e-3)
    np.testing.assert_array_equal(target, np.array([0, 0, t, -t, 0, 0], dtype=np.float32))
    assert message_info(message) == MessageInfo(form="bitmap", count=2, n=6, tau=float(t))


def test_sparse_form_layout() -> None:
    x = np.zeros(100, dtype=np.float32)
    x[[3, 50, 99]] = [1.0, -2.0, 3.0]
    message = encode(x, 0.5)
    assert message.tolist() == [3, 100, tau_bits(np.float32(0.5)), 0, 4, -51, 100]
    np.testing.assert_array_equal(x[[3, 50, 99]], [0.5, -1.5, 2.5])


@pytest.mark.parametrize("dtype", FLOATS)
def test_empty_and_all_below_threshold_send_nothing(dtype) -> None:
    assert encode(np.zeros(0, dtype=dtype), 1.0) is None
    x = np.linspace(-0.9, 0.9, 77).astype(dtype)
    before = x.copy()
    assert encode(x, 1.0) is None
    np.testing.assert_array_equal(uint_view(x), uint_view(before))


@pytest.mark.parametrize("dtype", FLOATS)
def test_length_one_is_a_bitmap(dtype) -> None:
    x = np.array([-2.0], dtype=dtype)
    message = encode(x, 1.0)
    assert message.tolist() == [1, 1, tau_bits(np.float32(1.0)), 1, 1 | (1 << 16)]
    assert x[0] == -1.0


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [15, 16, 17, 31, 32, 33, 160, 1000])
def test_all_above_threshold_is_a_full_bitmap(dtype, n) -> None:
    x = np.where(np.arange(n) % 3 == 0, -1.5, 1.5).astype(dtype)
    message = encode(x, 1.0)
    info = message_info(message)
    assert (info.form, info.count, info.n) == ("bitmap", n, n)
    assert message.size == 4 + -(-n // 16)
    np.testing.assert_array_equal(x, np.where(np.arange(n) % 3 == 0, -0.5, 0.5).astype(dtype))


@pytest.mark.parametrize("n", [16, 17, 160, 161, 1600])
def test_form_switches_exactly_at_ceil_n_over_16(n) -> None:
    words = -(-n // 16)
    for count, form in ((words - 1, "sparse"), (words, "bitmap")):
        if count == 0:
            continue
        x = np.zeros(n, dtype=np.float32)
        x[np.linspace(0, n - 1, count).astype(int)] = 2.0
        assert np.count_nonzero(x) == count
        info = message_info(encode(x, 1.0))
        assert (info.form, info.count) == (form, count)


def test_threshold_is_rounded_to_float32_first() -> None:
    # float32(1e-3) is a little above 1e-3, so a float64 residual of exactly 1e-3 does not reach it
    assert np.float64(np.float32(1e-3)) > 1e-3
    assert encode(np.array([1e-3, -1e-3]), 1e-3) is None
    x = np.array([0.0010000001, 0.0])
    message = encode(x, 1e-3)
    assert x[0] == 0.0010000001 - np.float64(np.float32(1e-3))
    assert message_info(message).tau == float(np.float32(1e-3))


# ---------------------------------------------------------------- properties against the reference

@PROPERTY
@given(residuals())
def test_encode_matches_the_numpy_reference(case) -> None:
    x, tau = case
    ours, theirs = x.copy(), x.copy()
    message = encode(ours, tau)
    expected = reference_encode(theirs, tau)
    if expected is None:
        assert message is None
    else:
        assert message is not None and message.dtype == np.int32
        np.testing.assert_array_equal(message, expected)
    np.testing.assert_array_equal(uint_view(ours), uint_view(theirs))


@PROPERTY
@given(residuals())
def test_decode_places_tau_exactly_where_the_residual_reached_it(case) -> None:
    x, tau = case
    original = x.copy()
    message = encode(x, tau)
    decoded = np.zeros_like(x)
    if message is not None:
        decode(message, decoded)
        reference = np.zeros_like(x)
        reference_decode(message, reference)
        np.testing.assert_array_equal(decoded, reference)
    np.testing.assert_array_equal(decoded, expected_delta(original, tau))
    # what was sent plus what was kept is what there was, up to one rounding of each element
    eps = np.finfo(x.dtype).eps
    np.testing.assert_allclose(decoded + x, original, rtol=2 * eps, atol=0)


@PROPERTY
@given(residuals())
def test_form_is_the_smaller_one(case) -> None:
    x, tau = case
    count = int(np.count_nonzero(expected_delta(x, tau)))
    counted_message, counted = encode_counted(x.copy(), tau)
    assert counted == count
    message = encode(x, tau)
    assert (message is None) == (counted_message is None)
    if count == 0:
        assert message is None
        return
    info = message_info(message)
    words = -(-x.size // 16)
    assert info.count == count and info.n == x.size
    assert info.form == ("sparse" if count < words else "bitmap")
    assert message.size == 4 + (count if count < words else words)


@PROPERTY
@given(residuals(), st.sampled_from([0.5, -2.0, 1e-3]))
def test_decode_scales_and_accumulates(case, scale) -> None:
    x, tau = case
    message = encode(x.copy(), tau)
    if message is None:
        return
    start = np.linspace(-1, 1, x.size).astype(x.dtype)
    ours, theirs = start.copy(), start.copy()
    decode(message, ours, scale)
    reference_decode(message, theirs, scale)
    np.testing.assert_array_equal(ours, theirs)


# ---------------------------------------------------------------- threads

@pytest.fixture
def small_chunks(monkeypatch):
    """Let encode(threads > 1) split even small vectors, so the chunked path is checked cheaply."""
    monkeypatch.setattr(codec_module, "PARALLEL_MIN_ELEMENTS_PER_THREAD", 512)


@PROPERTY
@given(residuals(min_size=1000, max_size=6000), st.integers(2, 4))
def test_threads_give_the_same_message_and_residual(small_chunks, case, threads) -> None:
    x, tau = case
    single, multi = x.copy(), x.copy()
    a = encode(single, tau)
    b = encode(multi, tau, threads=threads)
    assert (a is None) == (b is None)
    if a is not None:
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(uint_view(single), uint_view(multi))


@pytest.mark.parametrize("sparsity", [1e-3, 0.2])
def test_threads_on_a_vector_large_enough_to_split_by_default(sparsity) -> None:
    rng = np.random.default_rng(7)
    n = 2 * codec_module.PARALLEL_MIN_ELEMENTS_PER_THREAD + 12345
    x = rng.standard_normal(n).astype(np.float32)
    tau = float(np.quantile(np.abs(x), 1 - sparsity))
    assert len(codec_module._chunks(n, 2)) == 2
    single, multi = x.copy(), x.copy()
    np.testing.assert_array_equal(encode(single, tau), encode(multi, tau, threads=2))
    np.testing.assert_array_equal(single, multi)


# ---------------------------------------------------------------- non-finite residuals

@PROPERTY
@given(residuals(min_size=1, max_size=2000), st.sampled_from([np.nan, np.inf, -np.inf]), st.data())
def test_non_finite_names_the_first_bad_index_and_changes_nothing(case, bad, data) -> None:
    x, tau = case
    first = data.draw(st.integers(0, x.size - 1))
    x[first] = bad
    if first + 1 < x.size:
        x[data.draw(st.integers(first + 1, x.size - 1))] = np.nan
    before = x.copy()
    with pytest.raises(NonFiniteResidualError) as caught:
        encode(x, tau)
    assert caught.value.index == first
    assert str(first) in str(caught.value)
    np.testing.assert_array_equal(uint_view(x), uint_view(before))
    with pytest.raises(ReferenceNonFinite) as reference:
        reference_encode(before.copy(), tau)
    assert reference.value.index == first


def test_non_finite_in_a_later_chunk_with_threads(small_chunks) -> None:
    x = np.full(5000, 3.0, dtype=np.float32)
    x[4321] = np.inf
    before = x.copy()
    with pytest.raises(NonFiniteResidualError) as caught:
        encode(x, 1.0, threads=4)
    assert caught.value.index == 4321
    np.testing.assert_array_equal(x, before)


# ---------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("residual, error", [
    (np.zeros(10, dtype=np.int32), TypeError),
    (np.zeros(10, dtype=np.float16), TypeError),
    ([0.0, 1.0], TypeError),
    (np.zeros((2, 5), dtype=np.float32), ValueError),
    (np.zeros(20, dtype=np.float32)[::2], ValueError),
])
def test_encode_rejects_bad_residuals(residual, error) -> None:
    with pytest.raises(error):
        encode(residual, 1.0)


def test_encode_rejects_read_only_residual() -> None:
    x = np.ones(4, dtype=np.float32)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        encode(x, 0.5)


@pytest.mark.parametrize("threshold", [0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e39, "abc"])
def test_encode_rejects_bad_thresholds(threshold) -> None:
    x = np.ones(4, dtype=np.float32)
    with pytest.raises((ValueError, TypeError)):
        encode(x, threshold)
    np.testing.assert_array_equal(x, 1.0)


@pytest.mark.parametrize("threads", [0, -1, 1.5])
def test_encode_rejects_bad_thread_counts(threads) -> None:
    with pytest.raises(ValueError):
        encode(np.ones(4, dtype=np.float32), 0.5, threads=threads)


def test_decode_rejects_bad_targets() -> None:
    message = encode(np.ones(4, dtype=np.float32), 0.5)
    with pytest.raises(TypeError):
        decode(message, np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError):
        decode(message, np.zeros(8, dtype=np.float32)[::2])
    with pytest.raises(ValueError):
        decode(message, np.zeros(4, dtype=np.float32), scale=float("nan"))


def test_a_dense_chunk_inside_a_sparse_message(small_chunks) -> None:
    # the first chunk alone overflows its share of a sparse message, the whole vector does not
    x = np.zeros(4096, dtype=np.float32)
    x[:100] = np.where(np.arange(100) % 2, 2.0, -2.0)
    single, multi = x.copy(), x.copy()
    expected = reference_encode(x.copy(), 1.0)
    assert message_info(expected).form == "sparse"
    np.testing.assert_array_equal(encode(single, 1.0), expected)
    np.testing.assert_array_equal(encode(multi, 1.0, threads=4), expected)
    np.testing.assert_array_equal(single, multi)


@pytest.mark.parametrize("threads", [1, 4])
def test_non_finite_after_the_encoder_switched_to_bitmap(small_chunks, threads) -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(4096) * 3).astype(np.float32)  # most elements reach tau: bitmap
    x[3000] = -np.inf
    before = x.copy()
    with pytest.raises(NonFiniteResidualError) as caught:
        encode(x, 0.5, threads=threads)
    assert caught.value.index == 3000
    np.testing.assert_array_equal(uint_view(x), uint_view(before))


@pytest.mark.parametrize("threads", [1, 3])
def test_reused_work_buffers_carry_nothing_between_calls(small_chunks, threads) -> None:
    rng = np.random.default_rng(5)
    dense = (rng.standard_normal(4096) * 3).astype(np.float32)
    sparse = np.zeros(4096, dtype=np.float32)
    sparse[[5, 1000, 4000]] = [2.0, -2.0, 2.0]
    poisoned = dense.copy()
    poisoned[2500] = np.nan
    medium = np.zeros(4096, dtype=np.float32)  # a bitmap with many empty words: stale bits would show
    medium[rng.choice(4096, size=300, replace=False)] = 2.0
    for x in (dense, sparse, poisoned, medium, dense, medium, poisoned, sparse, medium):
        ours, theirs = x.copy(), x.copy()
        try:
            expected = reference_encode(theirs, 0.5)
        except ReferenceNonFinite:
            with pytest.raises(NonFiniteResidualError):
                encode(ours, 0.5, threads=threads)
            continue
        np.testing.assert_array_equal(encode(ours, 0.5, threads=threads), expected)
        np.testing.assert_array_equal(ours, theirs)
