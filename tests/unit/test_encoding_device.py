"""psrv.encoding.device (the torch codec) against the numba codec on CPU tensors: same bytes, same residual,
same errors. The CUDA comparison is marked ``gpu`` and skipped where CUDA is absent."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from psrv.encoding import (  # noqa: E402
    MalformedMessageError,
    NonFiniteResidualError,
    compact,
    decode,
    encode_counted,
)
from psrv.encoding import device as dev  # noqa: E402
from test_encoding import residuals, uint_view  # noqa: E402
from test_encoding_messages import MALFORMED  # noqa: E402

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA (torch.cuda.is_available() is False here)")


def both(x: np.ndarray, tau: float):
    """(numba message, numba residual, torch message, torch residual) of one residual."""
    host = x.copy()
    tensor = torch.from_numpy(x.copy())
    message, count = encode_counted(host, tau)
    device_message, device_count = dev.encode_counted(tensor, tau)
    assert count == device_count
    return message, host, device_message, tensor.numpy()


def assert_same(x: np.ndarray, tau: float) -> None:
    message, host, device_message, device_residual = both(x, tau)
    if message is None:
        assert device_message is None
    else:
        assert device_message.dtype == torch.int32
        assert device_message.numpy().tobytes() == message.tobytes()
    np.testing.assert_array_equal(uint_view(device_residual), uint_view(host))


@PROPERTY
@given(residuals(max_size=1100))
def test_encode_is_byte_identical_to_numba(case) -> None:
    x, tau = case
    assert_same(x, tau)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1023, 1024, 1025])
def test_lengths_all_below_all_above_and_the_form_boundary(dtype, n) -> None:
    rng = np.random.default_rng(n)
    assert_same((rng.uniform(-0.4, 0.4, n)).astype(dtype), 0.5)  # all below: nothing
    assert_same(np.where(rng.random(n) < 0.5, 1.0, -1.0).astype(dtype), 0.5)  # all above: bitmap
    words = -(-n // 16)
    for count in {max(words - 1, 0), words, words + 1}:  # sparse below ceil(n/16), bitmap from there
        x = np.zeros(n, dtype=dtype)
        x[rng.permutation(n)[:min(count, n)]] = rng.choice([-2.0, 2.0], size=min(count, n))
        assert_same(x, 0.5)


def test_negative_zero_subnormals_and_tau_rounding() -> None:
    tau = 0.1  # not a float32: both round it the same way
    x = np.array([-0.0, 0.0, np.float32(0.1), -np.float32(0.1), 1e-45, -1e-45,
                  np.nextafter(np.float32(0.1), 0)], dtype=np.float32)
    assert_same(x, tau)
    assert_same(x.astype(np.float64), tau)


@PROPERTY
@given(residuals(min_size=1, max_size=400), st.data())
def test_non_finite_raises_the_same_error_and_changes_nothing(case, data) -> None:
    x, tau = case
    bad = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    positions = data.draw(st.lists(st.integers(0, x.size - 1), min_size=1, max_size=3))
    x[positions] = bad
    tensor = torch.from_numpy(x.copy())
    with pytest.raises(NonFiniteResidualError) as host_error:
        encode_counted(x.copy(), tau)
    with pytest.raises(NonFiniteResidualError) as device_error:
        dev.encode(tensor, tau)
    assert device_error.value.index == host_error.value.index == min(positions)
    assert str(device_error.value) == str(host_error.value)
    np.testing.assert_array_equal(uint_view(tensor.numpy()), uint_view(x))


@PROPERTY
@given(residuals(max_size=1100), st.sampled_from([1.0, 0.5, -2.0]), st.booleans(), st.booleans())
def test_decode_equals_numba_decode(case, scale, as_tensor, packed) -> None:
    """Also for the packed form a message travels in (unpacked on the host, then applied)."""
    x, tau = case
    message, _ = encode_counted(x.copy(), tau)
    if message is None:
        return
    if packed:
        message = compact(message)
    start = np.random.default_rng(x.size).normal(size=x.size).astype(x.dtype)
    expected = start.copy()
    decode(message, expected, scale)
    target = torch.from_numpy(start.copy())
    dev.decode(torch.from_numpy(message) if as_tensor else message, target, scale)
    np.testing.assert_array_equal(uint_view(target.numpy()), uint_view(expected))


def test_decode_accepts_bytes_tensors_and_negative_zero_targets() -> None:
    x = np.zeros(40, dtype=np.float32)
    x[[3, 30]] = [1.0, -1.0]
    message, _ = encode_counted(x.copy(), 0.5)
    target = torch.full((40,), -0.0)
    dev.decode(torch.frombuffer(bytearray(message.tobytes()), dtype=torch.uint8), target)
    expected = np.full(40, -0.0, dtype=np.float32)
    decode(message, expected)
    np.testing.assert_array_equal(uint_view(target.numpy()), uint_view(expected))  # untouched -0.0 stays


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("as_tensor", [False, True])
def test_malformed_messages_raise_the_same_errors(name, as_tensor) -> None:
    message, n, _ = MALFORMED[name]
    if as_tensor:
        if not isinstance(message, np.ndarray) or message.dtype.kind not in "iu" or message.ndim != 1:
            pytest.skip("not representable as a 1-D int32 tensor; covered as a host message")
        message = torch.from_numpy(message.astype(np.int32))
    target = torch.linspace(-1, 1, n)
    before = target.clone()
    reference = np.linspace(-1, 1, n).astype(np.float32)
    with pytest.raises(MalformedMessageError) as host_error:
        decode(message.numpy() if as_tensor else message, reference)
    with pytest.raises(MalformedMessageError) as device_error:
        dev.decode(message, target)
    assert str(device_error.value) == str(host_error.value)
    assert torch.equal(target, before)


def test_malformed_tensor_messages_of_other_dtypes_and_shapes() -> None:
    target = torch.zeros(8)
    with pytest.raises(MalformedMessageError, match="dtype"):
        dev.decode(torch.zeros(6, dtype=torch.float32), target)
    with pytest.raises(MalformedMessageError, match="1-D"):
        dev.decode(torch.zeros((1, 6), dtype=torch.int32), target)
    with pytest.raises(MalformedMessageError, match="whole number"):
        dev.decode(torch.zeros(7, dtype=torch.uint8), target)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=12), st.integers(0, 40))
def test_random_tensor_messages_are_judged_like_numba(words, n) -> None:
    message = np.array(words, dtype=np.int32)
    reference = np.zeros(n, dtype=np.float32)
    target = torch.zeros(n)
    try:
        decode(message, reference)
    except MalformedMessageError as exc:
        with pytest.raises(MalformedMessageError) as device_error:
            dev.decode(torch.from_numpy(message), target)
        assert str(device_error.value) == str(exc)
        return
    dev.decode(torch.from_numpy(message), target)
    np.testing.assert_array_equal(target.numpy(), reference)


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(TypeError, match="torch.Tensor"):
        dev.encode(np.zeros(4, dtype=np.float32), 0.1)
    with pytest.raises(TypeError, match="float32 or float64"):
        dev.encode(torch.zeros(4, dtype=torch.float16), 0.1)
    with pytest.raises(ValueError, match="1-D"):
        dev.encode(torch.zeros((2, 2)), 0.1)
    with pytest.raises(ValueError, match="contiguous"):
        dev.encode(torch.zeros(8)[::2], 0.1)
    with pytest.raises(ValueError, match="positive"):
        dev.encode(torch.zeros(4), -1.0)
    with pytest.raises(ValueError, match="finite"):
        dev.decode(torch.zeros(4, dtype=torch.int32), torch.zeros(4), float("nan"))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("density", [1e-3, 0.05, 0.5])
def test_cuda_output_equals_cpu_output(dtype, density) -> None:
    rng = np.random.default_rng(7)
    n = 100_003
    x = torch.from_numpy(np.where(rng.random(n) < density, 2.0, 0.01) * rng.choice([-1, 1], n)).to(dtype)
    cpu, cuda = x.clone(), x.cuda()
    cpu_message, cuda_message = dev.encode(cpu, 1.0), dev.encode(cuda, 1.0)
    assert cuda_message.device.type == "cuda"
    assert torch.equal(cuda_message.cpu(), cpu_message)
    assert torch.equal(cuda.cpu(), cpu)
    cpu_target, cuda_target = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype, device="cuda")
    dev.decode(cpu_message, cpu_target)
    dev.decode(cuda_message, cuda_target)
    dev.decode(cpu_message.numpy(), cuda_target)  # a host message into a device target
    dev.decode(cpu_message, cpu_target)
    dev.decode(cpu_message.numpy(), cuda_target, device_copy=cuda_message)  # a worker's own message
    dev.decode(cpu_message, cpu_target)
    assert torch.equal(cuda_target.cpu(), cpu_target)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("update_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("debug", [False, True])
def test_residual_encoder_on_a_torch_residual_behaves_like_the_numpy_one(dtype, update_dtype, debug) -> None:
    from psrv.encoding import AdaptiveThreshold, ResidualClipping, ResidualEncoder

    def make(device):
        return ResidualEncoder(1000, dtype=dtype, threshold_algorithm=AdaptiveThreshold(0.05, 1e-3, 2e-2),
                               post_processor=ResidualClipping(2.0, 3), debug=debug, device=device)

    host, tensor = make(None), make("cpu")
    assert isinstance(tensor.residual, torch.Tensor)
    assert tensor.residual.dtype == getattr(torch, np.dtype(dtype).name)
    rng = np.random.default_rng(3)
    sent = 0
    for step in range(40):
        update = (rng.standard_t(2, 1000) * 0.01 * (1 + step % 7)).astype(update_dtype)
        message = host.encode_update(update)
        device_message = tensor.encode_update(torch.from_numpy(update))
        assert (message is None) == (device_message is None)
        if message is not None:
            assert device_message.numpy().tobytes() == message.tobytes()
            sent += 1
        np.testing.assert_array_equal(uint_view(tensor.residual.numpy()), uint_view(host.residual))
        assert tensor.threshold_algorithm.threshold == host.threshold_algorithm.threshold
        assert tensor.last_count == host.last_count
        assert tensor.last_stats == host.last_stats
    assert sent > 10 and tensor.post_processor.steps == host.post_processor.steps == 40
    tensor.reset()
    assert not bool(tensor.residual.any())
    with pytest.raises(ValueError, match="shape"):
        tensor.encode_update(torch.zeros(3))


@PROPERTY
@given(st.integers(1, 700), st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.0, 1.0)), min_size=0,
                                     max_size=8),
       st.sampled_from([np.float32, np.float64]), st.sampled_from([1.0, -0.5]), st.data())
def test_decode_many_equals_decoding_one_by_one(n, specs, dtype, scale, data) -> None:
    """A batch (sparse and bitmap messages, overlapping indices, a malformed one anywhere) decodes to
    exactly what the messages decoded one by one give; the bad one is skipped with decode's error."""
    rng = np.random.default_rng(n)
    messages: list = []
    for tau, density in specs:
        x = (np.where(rng.random(n) < density, 2.0, 0.0) * rng.choice([-1, 1], n)).astype(dtype)
        message, _ = encode_counted(x, tau)
        if message is not None:
            messages.append(message)
    bad_name = data.draw(st.sampled_from(sorted(MALFORMED) + [None]))
    bad_at = data.draw(st.integers(0, len(messages)))
    if bad_name is not None:
        messages.insert(bad_at, MALFORMED[bad_name][0])
    start = rng.normal(size=n).astype(dtype)
    expected = start.copy()
    expected_errors = []
    for message in messages:
        try:
            decode(message, expected, scale)
            expected_errors.append(None)
        except MalformedMessageError as exc:
            expected_errors.append(str(exc))
    target = torch.from_numpy(start.copy())
    errors = dev.decode_many(messages, target, scale)
    assert [None if e is None else str(e) for e in errors] == expected_errors
    np.testing.assert_array_equal(uint_view(target.numpy()), uint_view(expected))


@pytest.mark.parametrize("density", [1e-3, 0.5])
def test_decode_of_a_host_message_with_its_device_copy_equals_decoding_either(density) -> None:
    """A worker's own message: validated on its host copy, applied from its device copy; the same
    result as decoding either alone, and a host copy that is not that message changes nothing."""
    rng = np.random.default_rng(5)
    n = 3_001
    x = torch.from_numpy(np.where(rng.random(n) < density, 2.0, 0.01) * rng.choice([-1, 1], n)).float()
    message = dev.encode(x, 1.0)
    host = message.numpy().copy()
    start = torch.from_numpy(rng.normal(size=n).astype(np.float32))
    expected, target = start.clone(), start.clone()
    dev.decode(message, expected)
    dev.decode(host, target, device_copy=message)
    assert torch.equal(target, expected)
    with pytest.raises(ValueError, match="device_copy"):
        dev.decode(host, target, device_copy=message[:-1])
    bad = host.copy()
    bad[1] = n + 1  # the host copy says another N: rejected before anything is applied
    with pytest.raises(MalformedMessageError):
        dev.decode(bad, target, device_copy=message)
    assert torch.equal(target, expected)


def test_decode_many_takes_device_messages_and_rejects_another_n() -> None:
    x = np.zeros(50, dtype=np.float32)
    x[[1, 7, 49]] = [1.0, -1.0, 1.0]
    message, _ = encode_counted(x.copy(), 0.5)
    other, _ = encode_counted(np.ones(10, dtype=np.float32), 0.5)
    target = torch.zeros(50)
    packed = compact(message)  # the form a message arrives in from another node
    assert packed.nbytes < message.nbytes
    errors = dev.decode_many([message, torch.from_numpy(message), other, message, packed,
                              torch.from_numpy(packed)], target)
    assert errors[:2] == [None, None] and errors[3:] == [None] * 3
    assert "N=10" in str(errors[2])
    expected = np.zeros(50, dtype=np.float32)
    for _ in range(5):
        decode(message, expected)
    np.testing.assert_array_equal(target.numpy(), expected)
    assert dev.decode_many([], target) == []


@pytest.mark.gpu
@needs_cuda
def test_decode_many_on_cuda_equals_the_cpu_within_rounding() -> None:
    rng = np.random.default_rng(11)
    n = 50_000
    messages = []
    for tau in (0.5, 0.25, 0.125, 0.5):
        x = (np.where(rng.random(n) < 0.01, 2.0, 0.0) * rng.choice([-1, 1], n)).astype(np.float32)
        messages.append(encode_counted(x, tau)[0])
    cpu, cuda = torch.zeros(n), torch.zeros(n, device="cuda")
    assert dev.decode_many(messages, cpu) == [None] * 4
    assert dev.decode_many(messages, cuda) == [None] * 4
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=0, atol=1e-6)  # atomics may add in any order
