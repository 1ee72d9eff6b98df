"""The fused step path (residual += after - before, threshold scan and encoding in one pass; the live
parameters loaded into the snapshot and the step buffer in one pass) gives bit for bit what the passes
done apart give: the same messages, counts, residuals, threshold state and parameters, and NaN/inf
refused the same way."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.encoding import (
    AdaptiveThreshold,
    FixedThreshold,
    NonFiniteResidualError,
    ResidualClipping,
    ResidualEncoder,
    SampledQuantileThreshold,
)
from psrv.encoding.codec import (
    PARALLEL_MIN_ELEMENTS_PER_THREAD,
    add_difference,
    add_difference_encode_counted,
    copy_to_both,
    encode_counted,
)


def _bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint32 if array.dtype == np.float32 else np.uint64)


def _vectors(n: int, dtype, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    residual = (rng.standard_normal(n) * 1e-3).astype(dtype)
    before = rng.standard_normal(n).astype(dtype)
    after = (before + rng.standard_normal(n) * 1e-3).astype(dtype)
    return residual, after, before


def _apart(residual, after, before, tau, threads=1):
    """The reference: the difference written out, added, then encoded."""
    np.add(residual, np.subtract(after, before), out=residual)
    return encode_counted(residual, tau, threads=threads)


def _assert_same(fused, apart) -> None:
    (m1, c1), (m2, c2) = fused, apart
    assert c1 == c2
    assert (m1 is None) == (m2 is None)
    if m1 is not None:
        np.testing.assert_array_equal(m1, m2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 63, 64, 65, 1000, 100_003])
@pytest.mark.parametrize("tau", [1e-9, 1.5e-3, 3e-3, 1e6])  # all above (bitmap), dense, sparse, nothing
def test_fused_encoding_matches_the_passes_apart(dtype, n: int, tau: float) -> None:
    residual, after, before = _vectors(n, dtype, seed=n)
    reference = residual.copy()
    fused = add_difference_encode_counted(residual, after, before, tau)
    apart = _apart(reference, after, before, tau)
    _assert_same(fused, apart)
    np.testing.assert_array_equal(_bits(residual), _bits(reference))
    if tau == 1e6 or n == 0:
        assert fused == (None, 0)
    if tau == 1e-9 and n >= 64:
        assert fused[0][3] == 1  # every element reached tau: the bitmap form


def test_fused_encoding_matches_with_threads() -> None:
    n = 2 * PARALLEL_MIN_ELEMENTS_PER_THREAD + 37
    residual, after, before = _vectors(n, np.float32, seed=3)
    reference = residual.copy()
    _assert_same(add_difference_encode_counted(residual, after, before, 2e-3, threads=2),
                 _apart(reference, after, before, 2e-3, threads=2))
    np.testing.assert_array_equal(_bits(residual), _bits(reference))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 70, 999])
def test_non_finite_is_refused_as_before(bad: float, where: int) -> None:
    """Nothing emitted, the same first bad index, and the residual holds the difference added, whole."""
    residual, after, before = _vectors(1000, np.float32, seed=where)
    after[where] = bad
    reference = residual.copy()
    with pytest.raises(NonFiniteResidualError) as fused:
        add_difference_encode_counted(residual, after, before, 1e-3)
    with pytest.raises(NonFiniteResidualError) as apart:
        _apart(reference, after, before, 1e-3)
    assert fused.value.index == apart.value.index == where
    np.testing.assert_array_equal(_bits(residual), _bits(reference))


def test_overflow_to_inf_is_refused_as_before() -> None:
    residual, after, before = _vectors(300, np.float32, seed=9)
    after[200], before[200] = np.float32(3e38), np.float32(-3e38)  # finite inputs, an infinite step
    reference = residual.copy()
    with pytest.raises(NonFiniteResidualError), np.errstate(over="ignore"):
        add_difference_encode_counted(residual, after, before, 1e-3)
    with pytest.raises(NonFiniteResidualError), np.errstate(over="ignore"):
        _apart(reference, after, before, 1e-3)
    np.testing.assert_array_equal(_bits(residual), _bits(reference))


def test_add_difference_and_copy_to_both() -> None:
    residual, after, before = _vectors(1001, np.float64, seed=4)
    reference = residual + (after - before)
    add_difference(residual, after, before)
    np.testing.assert_array_equal(_bits(residual), _bits(reference))
    first, second = np.zeros_like(after), np.ones_like(after)
    copy_to_both(after, first, second)
    np.testing.assert_array_equal(first, after)
    np.testing.assert_array_equal(second, after)


def test_mismatched_vectors_are_refused() -> None:
    residual, after, before = _vectors(10, np.float32, seed=1)
    with pytest.raises(ValueError, match="after must match the residual"):
        add_difference_encode_counted(residual, after.astype(np.float64), before, 1e-3)
    with pytest.raises(ValueError, match="before must match the residual"):
        add_difference(residual, after, before[:5])


@pytest.mark.parametrize("make", [
    lambda: {"threshold_algorithm": AdaptiveThreshold(), "post_processor": ResidualClipping(5, 2)},
    lambda: {"threshold_algorithm": SampledQuantileThreshold(sample=512)},  # sees the residual first
    lambda: {"threshold_algorithm": FixedThreshold(1e-3), "debug": True},
    lambda: {"threshold_algorithm": AdaptiveThreshold(), "dtype": np.float64},
], ids=["adaptive-clipping", "quantile", "debug", "float64"])
def test_encoder_encode_difference_matches_encode_update(make) -> None:
    """Thirty steps of a drifting parameter vector: every message, the residual and the algorithms'
    state are the same through ``encode_difference`` as through ``encode_update(after - before)``."""
    n = 5000
    fused, apart = ResidualEncoder(n, **make()), ResidualEncoder(n, **make())
    dtype = fused.residual.dtype
    rng = np.random.default_rng(0)
    params = rng.standard_normal(n).astype(dtype)
    for _ in range(30):
        step = (rng.standard_normal(n) * rng.choice([1e-4, 1e-3, 1e-2])).astype(dtype)
        after = (params + step).astype(dtype)
        m1 = fused.encode_difference(after, params)
        m2 = apart.encode_update(after - params)
        assert (m1 is None) == (m2 is None)
        if m1 is not None:
            np.testing.assert_array_equal(m1, m2)
        params = after
    np.testing.assert_array_equal(_bits(fused.residual), _bits(apart.residual))
    assert fused.threshold_algorithm.get_state() == apart.threshold_algorithm.get_state()
    assert fused.post_processor.get_state() == apart.post_processor.get_state()
    assert fused.last_count == apart.last_count and fused.steps == apart.steps


def test_encoder_encode_difference_of_another_dtype_falls_back() -> None:
    """float64 parameters into a float32 residual: the difference is written and added as before."""
    fused, apart = ResidualEncoder(100), ResidualEncoder(100)
    rng = np.random.default_rng(2)
    before = rng.standard_normal(100)
    after = before + rng.standard_normal(100) * 1e-3
    np.testing.assert_array_equal(fused.encode_difference(after, before), apart.encode_update(after - before))
    np.testing.assert_array_equal(fused.residual, apart.residual)


class _SampleOnly(SampledQuantileThreshold):
    """The quantile threshold, recording each sample it is given; its whole-residual ``prepare`` must
    not be reached on the fused paths."""

    def __init__(self, **settings) -> None:
        super().__init__(**settings)
        self.samples: list[int] = []
        self.whole = 0

    def prepare(self, residual) -> None:
        self.whole += 1
        super().prepare(residual)

    def prepare_sample(self, picked) -> None:
        self.samples.append(int(picked.shape[0]))
        super().prepare_sample(picked)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sampled_threshold_is_given_only_the_sum_at_its_sampled_elements(dtype) -> None:
    """``encode_difference`` with the quantile threshold never writes the sum out before encoding: the
    algorithm gets the 500 elements of its stride (5000 / 512 -> every 10th), and every message, the
    residual and tau are bit for bit those of ``encode_update(after - before)`` with the plain
    algorithm, which is given the whole residual."""
    n = 5000
    fused = ResidualEncoder(n, dtype=dtype, threshold_algorithm=_SampleOnly(sample=512, sparsity=0.03))
    apart = ResidualEncoder(n, dtype=dtype, threshold_algorithm=SampledQuantileThreshold(sample=512,
                                                                                         sparsity=0.03))
    rng = np.random.default_rng(4)
    params = rng.standard_normal(n).astype(dtype)
    for _ in range(20):
        after = (params + rng.standard_normal(n) * rng.choice([1e-4, 1e-3])).astype(dtype)
        m1, m2 = fused.encode_difference(after, params), apart.encode_update(after - params)
        assert (m1 is None) == (m2 is None)
        if m1 is not None:
            np.testing.assert_array_equal(m1, m2)
        np.testing.assert_array_equal(_bits(fused.residual), _bits(apart.residual))
        assert fused.threshold_algorithm.threshold == apart.threshold_algorithm.threshold
        params = after
    assert fused.threshold_algorithm.samples == [500] * 20 and fused.threshold_algorithm.whole == 0
    assert fused.threshold_algorithm.steps == apart.threshold_algorithm.steps == 20


def test_a_sampled_threshold_refuses_a_non_finite_sum_as_the_passes_apart() -> None:
    """An inf in the step: both ways raise, and both residuals hold the whole sum, the inf included,
    with the algorithm's state alike."""
    n = 2000
    fused = ResidualEncoder(n, threshold_algorithm=SampledQuantileThreshold(sample=256))
    apart = ResidualEncoder(n, threshold_algorithm=SampledQuantileThreshold(sample=256))
    residual, after, before = _vectors(n, np.float32, seed=6)
    after[1234] = np.inf
    with pytest.raises(NonFiniteResidualError):
        fused.encode_difference(after, before)
    with pytest.raises(NonFiniteResidualError):
        apart.encode_update(after - before)
    np.testing.assert_array_equal(_bits(fused.residual), _bits(apart.residual))
    assert fused.threshold_algorithm.get_state() == apart.threshold_algorithm.get_state()


def test_a_sample_stride_that_is_not_a_positive_int_is_refused_by_name() -> None:
    class BadStride(SampledQuantileThreshold):
        def sample_stride(self, n: int) -> int:
            return 0

    encoder = ResidualEncoder(100, threshold_algorithm=BadStride())
    residual, after, before = _vectors(100, np.float32, seed=1)
    with pytest.raises(ValueError, match=r"BadStride.sample_stride\(100\) must be an int >= 1, got 0"):
        encoder.encode_difference(after, before)


def test_the_sampled_threshold_benchmark_runs_and_checks_both_ways_agree() -> None:
    """scripts/bench_sampled_threshold.py, briefly: one row per path, each step's messages compared."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_sampled_threshold.py"
    argv = [sys.executable, str(script), "--sizes", "1m", "--iterations", "3", "--repeats", "1"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| difference") or line.startswith("| gap")]
    assert [row.split(" | ")[0:2] for row in rows] == [["| difference", "1m"], ["| gap", "1m"]]
