"""The implicit residual (the gap between a persistent step buffer and the live parameters): the gap
kernel gives the message ``encode_counted`` gives on the materialized gap and leaves the live parameters
as ``decode`` does; the encoder's gap path advances the threshold and post-processor state as
``encode_update`` does; the node's writes are mirrored so the gap survives applies, installs and the
re-application of own updates after an install."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from psrv.encoding import (
    AdaptiveThreshold,
    FixedThreshold,
    ImplicitResidual,
    NonFiniteResidualError,
    NoResidualPostProcessor,
    ResidualClipping,
    ResidualEncoder,
    SampledQuantileThreshold,
)
from psrv.encoding.codec import (
    PARALLEL_MIN_ELEMENTS_PER_THREAD,
    clip_gap,
    encode_counted,
    encode_gap_counted,
)
from psrv.encoding.messages import decode


def _bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint32 if array.dtype == np.float32 else np.uint64)


def _pair(n: int, dtype, seed: int, spread: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    live = rng.standard_normal(n).astype(dtype)
    step = (live + rng.standard_normal(n) * spread).astype(dtype)
    return step, live


def _check_gap_encoding(step, live, tau, threads=1):
    """encode_gap_counted against the reference: encode_counted on step - live, decode into live."""
    step_before, reference = step.copy(), live.copy()
    message, count = encode_gap_counted(step, live, tau, threads=threads)
    expected, expected_count = encode_counted(np.subtract(step, reference), tau, threads=threads)
    assert count == expected_count
    assert (message is None) == (expected is None)
    if message is not None:
        np.testing.assert_array_equal(message, expected)
        decode(message, reference)
    np.testing.assert_array_equal(_bits(live), _bits(reference))
    np.testing.assert_array_equal(_bits(step), _bits(step_before))  # only read
    return message


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 15, 64, 65, 1000, 100_003])
@pytest.mark.parametrize("tau", [1e-9, 1.5e-3, 3e-3, 1e6])  # all above (bitmap), dense, sparse, nothing
def test_gap_encoding_is_the_encoding_of_the_materialized_gap(dtype, n: int, tau: float) -> None:
    step, live = _pair(n, dtype, seed=n)
    message = _check_gap_encoding(step, live, tau)
    if tau == 1e6 or n == 0:
        assert message is None
    if tau == 1e-9 and n >= 64:
        assert message[3] == 1  # every element reached tau: the bitmap form
    if tau == 3e-3 and n >= 1000:
        assert message[3] == 0  # a few: the sparse form


def test_gap_encoding_with_threads() -> None:
    step, live = _pair(2 * PARALLEL_MIN_ELEMENTS_PER_THREAD + 37, np.float32, seed=3)
    assert _check_gap_encoding(step, live, 2e-3, threads=2) is not None


def test_gap_encoding_with_one_chunk_denser_than_its_sparse_room() -> None:
    """Each thread's chunk has its share of the sparse room: a chunk whose hits overflow it switches to
    its bitmap, and the message is still the sparse one encode_counted gives."""
    n = 2 * PARALLEL_MIN_ELEMENTS_PER_THREAD + 37
    step, live = _pair(n, np.float32, seed=8, spread=1e-4)
    step[n // 2 + 1000:n // 2 + 101_000] += 1.0  # 100,000 hits in the second chunk; its share is ~65,500
    assert _check_gap_encoding(step, live, 0.5, threads=2)[3] == 0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 70, 300, 999])
def test_a_non_finite_gap_is_refused_with_nothing_changed(bad: float, where: int) -> None:
    step, live = _pair(1000, np.float32, seed=where)
    step[where] = bad
    step_before, live_before = step.copy(), live.copy()
    with pytest.raises(NonFiniteResidualError) as refused:
        encode_gap_counted(step, live, 1e-3)  # hits before `where` were applied to live, then undone
    with pytest.raises(NonFiniteResidualError) as reference:
        encode_counted(np.subtract(step, live), 1e-3)
    assert refused.value.index == reference.value.index == where
    np.testing.assert_array_equal(_bits(live), _bits(live_before))
    np.testing.assert_array_equal(_bits(step), _bits(step_before))


def test_clip_gap_moves_the_step_buffer_only_where_the_gap_is_beyond() -> None:
    step, live = _pair(1001, np.float64, seed=4, spread=1e-2)
    before = step.copy()
    clip_gap(step, live, 5e-3)
    gap = step - live
    beyond = np.abs(before - live) > 5e-3
    assert beyond.any() and (~beyond).any()
    np.testing.assert_array_equal(step[~beyond], before[~beyond])
    np.testing.assert_allclose(np.abs(gap[beyond]), 5e-3, rtol=1e-12)
    with pytest.raises(ValueError, match="live must match step"):
        clip_gap(step, live[:5], 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("limit", [5e-3, 5e-4])  # above tau (ResidualClipping's), and below it
def test_the_clip_inside_the_encoding_pass_is_clip_gap_afterwards(dtype, limit: float) -> None:
    fused_step, fused_live = _pair(100_003, dtype, seed=6, spread=1e-2)
    step, live = fused_step.copy(), fused_live.copy()
    fused, count = encode_gap_counted(fused_step, fused_live, 1e-3, clip=limit)
    expected, expected_count = encode_gap_counted(step, live, 1e-3)
    clip_gap(step, live, limit)
    assert count == expected_count > 0
    np.testing.assert_array_equal(fused, expected)
    np.testing.assert_array_equal(_bits(fused_live), _bits(live))
    np.testing.assert_array_equal(_bits(fused_step), _bits(step))
    rounding = np.spacing((np.abs(live) + limit).astype(dtype))  # of live +- limit
    assert np.all(np.abs(step - live) <= dtype(limit) + rounding)
    with pytest.raises(ValueError, match="clip must be positive and finite"):
        encode_gap_counted(step, live, 1e-3, clip=0.0)


class _HalveLarge:
    """A post-processor of a user's own: halves the residual where it exceeds 2 tau."""

    def process(self, residual: np.ndarray, threshold: float) -> None:
        large = np.abs(residual) > 2 * threshold
        residual[large] *= 0.5

    def get_state(self) -> dict[str, Any]:
        return {"type": "halve"}


@pytest.mark.parametrize("make", [
    lambda: {"threshold_algorithm": AdaptiveThreshold(), "post_processor": ResidualClipping(2, 2)},
    lambda: {"threshold_algorithm": SampledQuantileThreshold(sample=512)},  # sees the residual first
    lambda: {"threshold_algorithm": FixedThreshold(1e-3), "debug": True},
    lambda: {"threshold_algorithm": AdaptiveThreshold(), "post_processor": _HalveLarge(),
             "dtype": np.float64},
], ids=["adaptive-clipping", "quantile", "debug", "own-post-processor-float64"])
def test_encode_gap_advances_the_state_as_encode_update(make) -> None:
    """Thirty steps: the gap path and ``encode_update`` of the same gap (a fresh residual) send the same
    messages, leave the same residual (up to the rounding of the gap) and the same algorithm state."""
    n = 5000
    gapped, apart = ResidualEncoder(n, **make()), ResidualEncoder(n, **make())
    dtype = gapped.residual.dtype
    rng = np.random.default_rng(0)
    live = rng.standard_normal(n).astype(dtype)
    step = live.copy()
    for _ in range(30):
        step += (rng.standard_normal(n) * rng.choice([1e-4, 1e-3, 1e-2])).astype(dtype)
        apart.residual[...] = 0
        expected = apart.encode_update(np.subtract(step, live))
        message = gapped.encode_gap(step, live)
        assert (message is None) == (expected is None)
        if message is not None:
            np.testing.assert_array_equal(message, expected)
        np.testing.assert_allclose(step - live, apart.residual, rtol=0, atol=16 * np.finfo(dtype).eps)
        assert gapped.threshold_algorithm.get_state() == apart.threshold_algorithm.get_state()
        assert gapped.last_count == apart.last_count and gapped.steps == apart.steps
        if gapped.debug:
            assert gapped.last_stats == apart.last_stats
    assert gapped.post_processor.get_state() == apart.post_processor.get_state()


def _message(n: int, seed: int, tau: float = 2.0**-10) -> np.ndarray:
    rng = np.random.default_rng(seed)
    message, _ = encode_counted((rng.standard_normal(n) * tau).astype(np.float32), tau)
    return message


def test_the_gap_survives_applies_installs_and_reapplied_own_updates() -> None:
    """The node's writes (received updates, a download, an own update re-applied after it) move the
    live parameters; once mirrored the step buffer moved with them and the residual is what it was."""
    n = 3000
    encoder = ResidualEncoder(n, threshold_algorithm=FixedThreshold(2.0**-10),
                              post_processor=NoResidualPostProcessor())
    step, live = _pair(n, np.float32, seed=1)
    implicit = ImplicitResidual(encoder, live, step)
    residual = implicit.residual()
    own = implicit.encode_step()  # our message: live moves toward step, the rest stays in the gap
    assert own is not None
    residual_after_own = implicit.residual()
    np.testing.assert_allclose(residual_after_own, residual - _decoded(own), atol=1e-6)
    received = [_message(n, seed) for seed in range(3)]
    mirrored = step.copy()
    decode(received[0], mirrored)
    implicit.apply(received[0], {})
    np.testing.assert_array_equal(step, mirrored)  # no optimizer step runs: mirrored at once
    implicit.begin_step()  # the optimizer may write the step buffer now: the node's writes wait
    assert implicit.apply_many(received[1:] + [np.array([1, 2, 3], np.int32)], [{}] * 3)[2] is not None
    np.testing.assert_array_equal(step, mirrored)
    implicit.end_step()
    for message in received[1:]:
        decode(message, mirrored)
    np.testing.assert_array_equal(step, mirrored)
    implicit.begin_step()
    master = (live + np.float32(0.25)).astype(np.float32)  # a download that lacks our own update...
    implicit.installed(master)
    implicit.apply(own, {})  # ...which the node re-applies through the hook
    implicit.end_step()
    expected_live = master.copy()
    decode(own, expected_live)
    np.testing.assert_array_equal(live, expected_live)
    np.testing.assert_allclose(implicit.residual(), residual_after_own, atol=1e-6)
    implicit.set_residual(np.zeros(n, np.float32))
    np.testing.assert_array_equal(step, live)
    with pytest.raises(ValueError, match="step must be a float32 vector of 3000"):
        ImplicitResidual(encoder, live, step[:10])


def _decoded(message: np.ndarray) -> np.ndarray:
    out = np.zeros(int(message[1]), np.float32)
    decode(message, out)
    return out


KERNELS_OF_THE_HOOKS = ("encode_gap_range", "validate_sparse", "validate_bitmap", "apply_sparse",
                        "apply_bitmap")


def test_warm_up_compiles_before_joining_and_changes_nothing() -> None:
    """The kernels of the hooks and the gap pass are loaded by ``warm_up`` (a member compiling them in
    its step or I/O thread misses heartbeats on a loaded machine); the worker's vectors are untouched."""
    for dtype in (np.float32, np.float64):
        live = np.arange(10, dtype=dtype)
        step = live + 0.25
        encoder = ResidualEncoder(10, dtype=dtype)
        implicit = ImplicitResidual(encoder, live, step)
        state = encoder.threshold_algorithm.get_state()
        implicit.warm_up()
        np.testing.assert_array_equal(live, np.arange(10, dtype=dtype))
        np.testing.assert_array_equal(step, np.arange(10, dtype=dtype) + 0.25)
        assert encoder.threshold_algorithm.get_state() == state and encoder.steps == 0
    # in a fresh process (this one may have built them in other tests): none before, every one after
    probe = (
        "import numpy as np\n"
        "from psrv.encoding import ImplicitResidual, ResidualEncoder, _kernels\n"
        f"names = {KERNELS_OF_THE_HOOKS!r}\n"
        "before = [getattr(_kernels, n)._dispatcher is None for n in names]\n"
        "live = np.zeros(8, np.float32)\n"
        "ImplicitResidual(ResidualEncoder(8), live, live.copy()).warm_up()\n"
        "print(all(before), all(getattr(_kernels, n)._dispatcher is not None for n in names))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"], done.stdout


def test_a_sampled_threshold_never_writes_the_gap_out() -> None:
    """With the quantile threshold the gap is computed at the sampled elements only: the encoder's
    scratch vector is never written, and the messages, tau and live parameters are those of
    ``encode_update`` of the gap written out."""
    n = 4000
    gapped = ResidualEncoder(n, threshold_algorithm=SampledQuantileThreshold(sample=400, sparsity=0.03),
                             post_processor=NoResidualPostProcessor())
    apart = ResidualEncoder(n, threshold_algorithm=SampledQuantileThreshold(sample=400, sparsity=0.03),
                            post_processor=NoResidualPostProcessor())
    gapped.residual[...] = np.nan  # the scratch: untouched unless the gap is written out
    step, live = _pair(n, np.float32, seed=3)
    expected_live = live.copy()
    rng = np.random.default_rng(5)
    for _ in range(10):
        step += (rng.standard_normal(n) * 1e-3).astype(np.float32)
        apart.residual[...] = 0
        expected = apart.encode_update(np.subtract(step, live))
        message = gapped.encode_gap(step, live)
        assert message is not None and expected is not None
        np.testing.assert_array_equal(message, expected)
        decode(expected, expected_live)
        np.testing.assert_array_equal(live, expected_live)
        assert gapped.threshold_algorithm.threshold == apart.threshold_algorithm.threshold
    assert np.isnan(gapped.residual).all()
