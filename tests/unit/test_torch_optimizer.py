"""psrv.torch.DistributedOptimizer on its own (no launcher): the replica invariant under concurrency, and
the step it encodes is exactly the wrapped optimizer's step, whatever the user's loop does around it
(param groups, a scheduler, accumulation, clipping, autocast + GradScaler); its state round-trips."""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.encoding import (  # noqa: E402
    AdaptiveThreshold,
    FixedThreshold,
    NoResidualPostProcessor,
    ResidualEncoder,
    decode,
)
from psrv.torch import DistributedOptimizer, LauncherRequiredError, SharingConfigError  # noqa: E402

GRID = 2.0**-12  # params on this grid, updates of +-2^-10: every float32 sum is exact in any order


def _model(seed: int = 1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(seed: int, n: int = 24):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _loss(model, seed: int):
    x, y = _batch(seed)
    return torch.nn.functional.cross_entropy(model(x), y)


def _messages(size: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    encoder = ResidualEncoder(size, threshold_algorithm=FixedThreshold(2.0**-10))
    out = []
    while len(out) < count:
        message = encoder.encode_update((rng.standard_normal(size) * 2.0**-10).astype(np.float32))
        if message is not None:
            out.append(message)
    return out


def test_updates_decoded_during_steps_are_never_lost() -> None:
    """A thread decodes 300 messages into the live parameters (as the node's I/O thread does, under the
    optimizer's lock) while the user's loop steps: the parameters end exactly at the start plus every
    decoded message plus every message the optimizer applied itself."""
    model = _model()
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False,
                               threshold_algorithm=FixedThreshold(2.0**-10))
    live = opt.flat_params.numpy()
    live[...] = np.round(live / GRID) * GRID
    start = live.astype(np.float64)
    own: list[np.ndarray] = []
    encode, encode_difference = opt.encoder.encode_update, opt.encoder.encode_difference
    opt.encoder.encode_update = lambda update: own.append(encode(update)) or own[-1]
    opt.encoder.encode_difference = lambda *pair: own.append(encode_difference(*pair)) or own[-1]
    messages = _messages(opt.num_params, 300)
    done = threading.Event()

    def io_thread() -> None:
        for message in messages:
            with opt.lock:
                decode(message, live)
            time.sleep(0.0003)
        done.set()

    opt.optimizer.register_step_post_hook(lambda *_: time.sleep(0.001))  # widen the step
    thread = threading.Thread(target=io_thread)
    thread.start()
    steps = 0
    while not done.is_set() or steps < 5:
        opt.zero_grad()
        _loss(model, steps).backward()
        opt.step()
        steps += 1
    thread.join(30)
    expected = start.copy()
    for message in messages + [m for m in own if m is not None]:
        decode(message, expected)
    assert sum(m is not None for m in own) > 0
    np.testing.assert_array_equal(live.astype(np.float64), expected)
    # the module computes with the live vector itself
    computed_with = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
    np.testing.assert_array_equal(computed_with, live)


def test_update_decoded_inside_the_step_is_kept() -> None:
    """Deterministic: a message lands during the wrapped optimizer's own step; it stays."""
    model = _model()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model,
                               join=False, threshold_algorithm=FixedThreshold(1e6))  # nothing sent
    live = opt.flat_params.numpy()
    live[...] = np.round(live / GRID) * GRID
    (message,) = _messages(opt.num_params, 1)
    expected = live.astype(np.float64)
    decode(message, expected)
    opt.optimizer.register_step_post_hook(lambda *_: decode(message, live))
    _loss(model, 0).backward()
    opt.step()
    np.testing.assert_array_equal(live.astype(np.float64), expected)


def _bare_and_wrapped(make_optimizer):
    """The same model twice: one with the bare optimizer, one wrapped with a threshold nothing reaches
    (the wrapped step then stays in the residual, where the test reads it)."""
    bare_model, model = _model(), _model()
    bare = make_optimizer(bare_model)
    wrapped = DistributedOptimizer(make_optimizer(model), model, join=False,
                                   threshold_algorithm=FixedThreshold(1e6),
                                   post_processor=NoResidualPostProcessor())
    return bare_model, bare, model, wrapped


def _param_groups(model):
    return [{"params": model[0].parameters(), "lr": 3e-3}, {"params": model[2].parameters(), "lr": 1e-3}]


@pytest.mark.parametrize("amp", [False, True])
def test_the_encoded_step_is_the_users_step(amp: bool) -> None:
    """AdamW with two param groups, a cosine scheduler, accumulation over 2 backward passes,
    clip_grad_norm_, and (amp) autocast + GradScaler: the residual holds what the bare optimizer moved
    its parameters by, summed over the steps (both take every step from the same point)."""
    bare_model, bare, model, wrapped = _bare_and_wrapped(
        lambda m: torch.optim.AdamW(_param_groups(m), weight_decay=1e-2))
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    schedulers = [torch.optim.lr_scheduler.CosineAnnealingLR(o, 4) for o in (bare, wrapped)]
    moved = torch.zeros_like(before)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**8) for _ in range(2)] if amp else [None, None]
    for step in range(4):
        for net, opt, scheduler, scaler in zip((bare_model, model), (bare, wrapped), schedulers, scalers,
                                               strict=True):
            opt.zero_grad()
            for micro in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = _loss(net, 10 * step + micro) / 2
                (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            scheduler.step()
        # the wrapped model stays where it was (nothing was sent): put the bare one back there too, so
        # both compute the next gradients at the same point; the residual sums the bare steps
        moved += torch.nn.utils.parameters_to_vector(bare_model.parameters()).detach() - before
        torch.nn.utils.vector_to_parameters(before.clone(), bare_model.parameters())
    np.testing.assert_allclose(wrapped.encoder.residual, moved.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(torch.nn.utils.parameters_to_vector(model.parameters()).detach(), before)
    assert [g["lr"] for g in wrapped.param_groups] == [g["lr"] for g in bare.param_groups]
    assert wrapped.iterations == 4


def test_state_dict_round_trips_optimizer_residual_and_threshold() -> None:
    model = _model()
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False)
    for step in range(3):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
    state = copy.deepcopy(opt.state_dict())
    other_model = _model(seed=2)
    other = DistributedOptimizer(torch.optim.Adam(other_model.parameters(), lr=1e-2), other_model,
                                 join=False)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.encoder.residual, opt.encoder.residual)
    assert other.encoder.threshold_algorithm.get_state() == opt.encoder.threshold_algorithm.get_state()
    assert other.iterations == 3
    for a, b in zip(other.optimizer.state.values(), opt.optimizer.state.values(), strict=True):
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
    torch.manual_seed(0)  # the same next step from the same state and the same parameters
    other_model.load_state_dict(model.state_dict())
    for o, m in ((opt, model), (other, other_model)):
        o.zero_grad()
        _loss(m, 9).backward()
        o.step()
    np.testing.assert_array_equal(other.encoder.residual, opt.encoder.residual)


def test_clear_errors() -> None:
    model = _model()
    with pytest.raises(SharingConfigError, match="torch.optim.Optimizer"):
        DistributedOptimizer(object(), model, join=False)
    with pytest.raises(LauncherRequiredError, match="psrv run -n N"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    other = _model()
    with pytest.raises(SharingConfigError, match="not the model's trainable parameters"):
        DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), model, join=False)


def test_device_encoding_gives_the_host_encodings_replica() -> None:
    """The device path (torch codec, DeviceSharing's hooks; what a GPU worker runs) on CPU tensors: the
    same parameters and residual as the numba path, step after step."""
    runs = []
    for on_device in (False, True):
        model = _model()
        opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False,
                                   threshold_algorithm=FixedThreshold(1e-3), device_encoding=on_device)
        for step in range(5):
            opt.zero_grad()
            _loss(model, step).backward()
            opt.step()
        runs.append((opt.flat_params.detach().clone(), opt.state_dict()["residual"], opt.messages))
    (host_params, host_residual, host_messages), (dev_params, dev_residual, dev_messages) = runs
    assert host_messages == dev_messages == 5
    np.testing.assert_array_equal(dev_params.numpy(), host_params.numpy())
    np.testing.assert_array_equal(dev_residual, host_residual)


def test_the_one_pass_step_equals_the_passes_apart() -> None:
    """The host step (one-pass load, one-pass residual sum + encoding) against the same optimizer taking
    the difference as a tensor and encoding it apart: the same messages, residual and parameters, bit
    for bit, over steps that go from dense bitmaps to sparse messages."""
    runs = []
    for fused in (True, False):
        model = _model()
        opt = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), model, join=False,
                                   threshold_algorithm=AdaptiveThreshold(3e-3, max_sparsity=0.05, decay=0.5))
        if not fused:
            encode = opt.encoder.encode_update
            opt.encoder.encode_difference = lambda after, before, encode=encode: encode(
                (torch.from_numpy(after) - torch.from_numpy(before)).numpy())
        sent = []
        submit = opt._submit
        opt._submit = lambda message, submit=submit, sent=sent: sent.append(message.copy()) or submit(message)
        for step in range(40):
            opt.zero_grad()
            _loss(model, step).backward()
            opt.step()
        runs.append((sent, opt.encoder.residual.copy(), opt.flat_params.detach().numpy().copy()))
    (sent1, residual1, params1), (sent2, residual2, params2) = runs
    assert len(sent1) == len(sent2) > 0
    assert any(m[3] == 1 for m in sent1) and any(m[3] == 0 for m in sent1)  # bitmaps and sparse ones
    for a, b in zip(sent1, sent2, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(residual1.view(np.uint32), residual2.view(np.uint32))
    np.testing.assert_array_equal(params1.view(np.uint32), params2.view(np.uint32))
