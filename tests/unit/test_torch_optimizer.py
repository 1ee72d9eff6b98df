"""psrv.torch.DistributedOptimizer on its own (no launcher): the replica invariant under concurrency (the
node's writes go through the implicit residual's apply hook, as the I/O thread's do), the step buffer
evolves exactly as the bare optimizer's parameters whatever the user's loop does around it (param
groups, a scheduler, accumulation, clipping, autocast + GradScaler), each message is the encoding of the
gap between the step buffer and the live parameters, and the state round-trips."""

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
from psrv.encoding.codec import encode_counted  # noqa: E402
from psrv.torch import DistributedOptimizer, LauncherRequiredError, SharingConfigError  # noqa: E402

GRID = 2.0**-12  # params on this grid, updates of +-2^-10: every float32 sum is exact in any order


def _model(seed: int = 1, grid: bool = False):
    """A small MLP; ``grid``: its weights rounded onto GRID (before it is wrapped, as weights are loaded)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if grid:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.round(p / GRID) * GRID)
    return model


def _batch(seed: int, n: int = 24):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _loss(model, seed: int):
    x, y = _batch(seed)
    return torch.nn.functional.cross_entropy(model(x), y)


def _assert_bit_for_bit(model, reference) -> torch.Tensor:
    """The model's parameters equal the reference's bit for bit; returns them as one vector."""
    ours = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    theirs = torch.nn.utils.parameters_to_vector(reference.parameters()).detach()
    np.testing.assert_array_equal(ours.numpy().view(np.uint32), theirs.numpy().view(np.uint32))
    return ours


def _messages(size: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    encoder = ResidualEncoder(size, threshold_algorithm=FixedThreshold(2.0**-10))
    out = []
    while len(out) < count:
        message = encoder.encode_update((rng.standard_normal(size) * 2.0**-10).astype(np.float32))
        if message is not None:
            out.append(message)
    return out


@pytest.mark.parametrize("step_from", ["own", "shared"])
def test_updates_decoded_during_steps_are_never_lost(step_from: str) -> None:
    """A thread applies 300 messages through the node's apply hook (as the node's I/O thread does, under
    the optimizer's lock) while the user's loop steps: the parameters end exactly at the start plus every
    received message plus every message the optimizer applied itself."""
    model = _model(grid=True)
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False,
                               threshold_algorithm=FixedThreshold(2.0**-10), step_from=step_from)
    live = opt.flat_params.numpy()
    start = live.astype(np.float64)
    own: list[np.ndarray] = []
    encode_step = opt.implicit.encode_step
    opt.implicit.encode_step = lambda: own.append(encode_step()) or own[-1]
    messages = _messages(opt.num_params, 300)
    done = threading.Event()

    def io_thread() -> None:
        for message in messages:
            with opt.lock:
                opt.implicit.apply(message, {})
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
    computed_with = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
    if step_from == "shared":  # the module computes with the live vector itself
        np.testing.assert_array_equal(computed_with, live)
    else:  # with the step buffer: the live vector plus the residual (the received messages included)
        np.testing.assert_array_equal(computed_with, opt._buffers.step_flat.numpy())
        np.testing.assert_allclose(computed_with - live, opt.implicit.residual(), atol=1e-6)
        assert np.abs(opt.implicit.residual()).max() > 0
    opt.leave()  # from here on the module computes with the replica
    computed_with = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
    np.testing.assert_array_equal(computed_with, live)


def test_update_decoded_inside_the_step_is_kept() -> None:
    """Deterministic: a message lands (through the apply hook) during the wrapped optimizer's own step;
    it stays, and the next step, with a tau below the message's, does not send it back negated (what a
    step buffer that missed the node's write would do: its gap would hold minus the message)."""
    model = _model(grid=True)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9), model,
                               join=False, threshold_algorithm=FixedThreshold(1e6),  # nothing sent
                               post_processor=NoResidualPostProcessor())
    live = opt.flat_params.numpy()
    (message,) = _messages(opt.num_params, 1)
    expected = live.astype(np.float64)
    decode(message, expected)
    hook = opt.optimizer.register_step_post_hook(lambda *_: opt.implicit.apply(message, {}))
    _loss(model, 0).backward()
    opt.step()
    hook.remove()
    np.testing.assert_array_equal(live.astype(np.float64), expected)
    opt.encoder.threshold_algorithm = FixedThreshold(2.0**-11)
    opt.zero_grad()
    _loss(model, 1).backward()
    opt.step()
    assert opt.messages == 0  # the two small SGD steps stay below tau; the message is not echoed
    np.testing.assert_array_equal(live.astype(np.float64), expected)
    assert np.abs(opt.state_dict()["residual"]).max() < 2.0**-11


def _param_groups(params):
    params = list(params)
    return [{"params": params[:2], "lr": 3e-3}, {"params": params[2:], "lr": 1e-3}]


@pytest.mark.parametrize("amp", [False, True])
def test_the_step_buffer_evolves_as_the_bare_optimizers_parameters(amp: bool) -> None:
    """AdamW (weight decay) with two param groups, a cosine scheduler, accumulation over 2 backward
    passes, clip_grad_norm_, and (amp) autocast + GradScaler; nothing is sent, so both compute every
    gradient at the start: the wrapped step buffer equals the bare optimizer's parameters bit for bit,
    the residual is their distance from the start, and the live parameters never moved."""
    reference, model = _model(), _model()  # the bare optimizer steps copies; `reference` stays put
    bare_params = [p.detach().clone().requires_grad_() for p in reference.parameters()]
    bare = torch.optim.AdamW(_param_groups(bare_params), weight_decay=1e-2)
    wrapped = DistributedOptimizer(torch.optim.AdamW(_param_groups(model.parameters()), weight_decay=1e-2),
                                   model, join=False, threshold_algorithm=FixedThreshold(1e6),
                                   post_processor=NoResidualPostProcessor(), step_from="shared")
    start = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    schedulers = [torch.optim.lr_scheduler.CosineAnnealingLR(o, 4) for o in (bare, wrapped)]
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**8) for _ in range(2)] if amp else [None, None]
    for step in range(4):
        for net, opt, scheduler, scaler in zip((reference, model), (bare, wrapped), schedulers, scalers,
                                               strict=True):
            opt.zero_grad()
            net.zero_grad()
            for micro in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = _loss(net, 10 * step + micro) / 2
                (scaler.scale(loss) if scaler else loss).backward()
            if opt is bare:
                for shadow, p in zip(bare_params, reference.parameters(), strict=True):
                    shadow.grad = p.grad.clone()
            if scaler:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(bare_params if opt is bare else net.parameters(), 0.5)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            scheduler.step()
    bare_vector = torch.nn.utils.parameters_to_vector(bare_params).detach()
    np.testing.assert_array_equal(wrapped._buffers.step_flat.numpy().view(np.uint32),
                                  bare_vector.numpy().view(np.uint32))
    np.testing.assert_array_equal(wrapped.state_dict()["residual"], (bare_vector - start).numpy())
    np.testing.assert_array_equal(torch.nn.utils.parameters_to_vector(model.parameters()).detach(), start)
    assert not torch.equal(bare_vector, start)
    assert [g["lr"] for g in wrapped.param_groups] == [g["lr"] for g in bare.param_groups]
    assert wrapped.iterations == 4 and wrapped.messages == 0


@pytest.mark.parametrize("amp", [False, True])
def test_stepping_from_its_own_point_alone_the_model_is_the_bare_optimizers_bit_for_bit(amp: bool) -> None:
    """step_from="own" (the default) with nothing sent: the model computes with the step buffer, so the
    wrapped loop IS a plain training loop (AdamW, two param groups, a cosine scheduler, accumulation,
    clip_grad_norm_, autocast + GradScaler): its parameters equal a bare optimizer's model's bit for bit
    at every step, the live parameters (the replica) never move, and after leave() the model holds them."""
    reference, model = _model(), _model()
    bare = torch.optim.AdamW(_param_groups(reference.parameters()), weight_decay=1e-2)
    wrapped = DistributedOptimizer(torch.optim.AdamW(_param_groups(model.parameters()), weight_decay=1e-2),
                                   model, join=False, threshold_algorithm=FixedThreshold(1e6),
                                   post_processor=NoResidualPostProcessor())
    assert wrapped.step_from == "own"
    start = wrapped.flat_params.detach().clone()
    schedulers = [torch.optim.lr_scheduler.CosineAnnealingLR(o, 4) for o in (bare, wrapped)]
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**8) for _ in range(2)] if amp else [None, None]
    for step in range(4):
        for net, opt, scaler in zip((reference, model), (bare, wrapped), scalers, strict=True):
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
        for scheduler in schedulers:
            scheduler.step()
        ours = _assert_bit_for_bit(model, reference)
    assert not torch.equal(ours, start)
    np.testing.assert_array_equal(wrapped.flat_params.numpy(), start.numpy())  # the replica never moved
    np.testing.assert_array_equal(wrapped.state_dict()["residual"], (ours - start).numpy())
    with wrapped.on_replica():  # the shared model, for an evaluation in the middle of training
        np.testing.assert_array_equal(torch.nn.utils.parameters_to_vector(model.parameters()).detach(), start)
    np.testing.assert_array_equal(torch.nn.utils.parameters_to_vector(model.parameters()).detach(), ours)
    assert wrapped.leave()["step_from"] == "own"
    np.testing.assert_array_equal(torch.nn.utils.parameters_to_vector(model.parameters()).detach(), start)


@pytest.mark.parametrize("kind", ["SGD", "RMSprop"])
def test_a_wrapped_optimizer_with_its_momentum_set_for_the_workers_steps_as_one_built_with_those_values(
        kind: str) -> None:
    """What joining with scale_momentum=True does to a wrapped SGD (or RMSprop with momentum):
    ``momentum_for_workers`` of the wrapped optimizer, for 3 workers. It steps, through the step buffer,
    as a bare one built with momentum 0.9 ** 3 and the lr scaled to keep the step's size (RMSprop's
    square average started at the first gradient's square), bit for bit, a StepLR attached before
    wrapping included."""
    from psrv.nn.momentum import SQUARE_START_NAME, lr_factor, momentum_for_workers, start_square_averages

    def make(params, lr: float, momentum: float) -> torch.optim.Optimizer:
        if kind == "SGD":
            return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True)
        return torch.optim.RMSprop(params, lr=lr, momentum=momentum, centered=True)

    reference, model = _model(), _model()
    bare = make(reference.parameters(), 0.05 * lr_factor(0.9, 3), 0.9 ** 3)
    start_square_averages(bare)  # RMSprop's square average from the first gradient's square: SGD has none
    inner = make(model.parameters(), 0.05, 0.9)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, 2, gamma=0.5) for o in (bare, inner)]
    wrapped = DistributedOptimizer(inner, model, join=False, threshold_algorithm=FixedThreshold(1e6),
                                   post_processor=NoResidualPostProcessor())
    changes = momentum_for_workers(wrapped.optimizer, 3)
    assert [(c.name, c.given) for c in changes] == [(f"{kind} momentum", 0.9), (f"{kind} lr", 0.05)] + (
        [(f"RMSprop {SQUARE_START_NAME}", 0.0)] if kind == "RMSprop" else [])
    assert wrapped.param_groups[0]["lr"] == bare.param_groups[0]["lr"]
    for step in range(5):
        for net, opt in ((reference, bare), (model, wrapped)):
            opt.zero_grad()
            _loss(net, step).backward()
            opt.step()
        for scheduler in schedulers:
            scheduler.step()
        _assert_bit_for_bit(model, reference)
    assert wrapped.param_groups[0]["lr"] == pytest.approx(0.05 * lr_factor(0.9, 3) / 4, rel=1e-15)


def test_step_from_is_checked() -> None:
    model = _model()
    with pytest.raises(SharingConfigError, match="step_from.*'own'.*'shared'.*got 'mine'"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, join=False, step_from="mine")


def test_on_the_device_path_the_model_steps_from_the_replica_plus_the_residual() -> None:
    """device_encoding (a GPU worker's path; CPU tensors here) with step_from="own": after every step the
    step buffer, which the model computes with, is reloaded with the replica plus the residual. With
    nothing sent the model follows the bare optimizer's parameters (to the rounding of that sum); with
    messages the replica holds exactly what was sent."""
    reference, model = _model(), _model()
    bare = torch.optim.Adam(reference.parameters(), lr=1e-2)
    wrapped = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False,
                                   threshold_algorithm=FixedThreshold(1e6),
                                   post_processor=NoResidualPostProcessor(), device_encoding=True)
    assert wrapped.step_from == "own" and wrapped.implicit is None
    start = wrapped.flat_params.detach().clone()
    for step in range(5):
        for net, opt in ((reference, bare), (model, wrapped)):
            opt.zero_grad()
            _loss(net, step).backward()
            opt.step()
    ours = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    theirs = torch.nn.utils.parameters_to_vector(reference.parameters()).detach()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert not torch.equal(ours, start) and torch.equal(wrapped.flat_params, start)  # nothing sent
    other = _model()
    sending = DistributedOptimizer(torch.optim.Adam(other.parameters(), lr=1e-2), other, join=False,
                                   threshold_algorithm=FixedThreshold(1e-3), device_encoding=True)
    sent = torch.zeros_like(sending.flat_params)
    replica_start = sending.flat_params.detach().clone()
    submit = sending._submit_from_device

    def recording(message):
        from psrv.encoding import device as codec

        codec.decode(message, sent)
        submit(message)

    sending._submit_from_device = recording
    for step in range(5):
        sending.zero_grad()
        _loss(sending.model, step).backward()
        sending.step()
    assert sending.messages == 5
    torch.testing.assert_close(sending.flat_params, replica_start + sent, rtol=0, atol=1e-6)
    computed_with = torch.nn.utils.parameters_to_vector(sending.model.parameters()).detach()
    torch.testing.assert_close(computed_with, sending.flat_params + sending.encoder.residual, rtol=0, atol=0)


def test_state_dict_round_trips_optimizer_residual_and_threshold() -> None:
    """Saved, then loaded into a new optimizer over a model given the same weights before wrapping: the
    same optimizer and threshold state, the residual up to the rounding of the parameters' precision
    (it lives as the step buffer's distance from them), and the same next step."""
    model = _model()
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False,
                               step_from="shared")
    for step in range(3):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
    state = copy.deepcopy(opt.state_dict())
    other_model = _model(seed=2)
    other_model.load_state_dict(model.state_dict())  # weights first, then wrap
    other = DistributedOptimizer(torch.optim.Adam(other_model.parameters(), lr=1e-2), other_model,
                                 join=False, step_from="shared")
    other.load_state_dict(state)
    live = opt.flat_params.numpy()
    rounding = 2 * np.spacing(np.abs(live) + np.abs(state["residual"]))
    assert np.abs(state["residual"]).max() > 0
    assert np.all(np.abs(other.state_dict()["residual"] - state["residual"]) <= rounding)
    assert other.encoder.threshold_algorithm.get_state() == opt.encoder.threshold_algorithm.get_state()
    assert other.iterations == 3
    for a, b in zip(other.optimizer.state.values(), opt.optimizer.state.values(), strict=True):
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
    for o, m in ((opt, model), (other, other_model)):  # the same next step from the same state and point
        o.zero_grad()
        _loss(m, 9).backward()
        o.step()
    np.testing.assert_array_equal(other.flat_params.numpy(), live)
    assert np.all(np.abs(other.state_dict()["residual"] - opt.state_dict()["residual"]) <= 2 * rounding)


def test_clear_errors() -> None:
    model = _model()
    with pytest.raises(SharingConfigError, match="torch.optim.Optimizer"):
        DistributedOptimizer(object(), model, join=False)
    with pytest.raises(LauncherRequiredError, match="psrv run -n N"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    other = _model()
    with pytest.raises(SharingConfigError, match="not the model's trainable parameters"):
        DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), model, join=False)


def test_the_defaults_are_dl4js_threshold_and_the_masters_clipping_and_momentum_as_given() -> None:
    """A wrapped optimizer starts from DL4J's threshold (tau 1e-3, not ResidualEncoder's 1e-4, below
    which Adam's whole first step would be sent) and the clipping a Spark fit starts from; the master's
    threshold is the 3 % quantile, which would cost this optimizer a pass more per step. Its momentum is
    the user's unless scale_momentum is asked for."""
    from psrv.encoding import dl4j_threshold, shared_training_threshold
    from psrv.spark import SharedTrainingMaster

    model = _model()
    wrapped = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model, join=False)
    master = SharedTrainingMaster(batch_size_per_worker=8)
    assert wrapped.encoder.threshold_algorithm.get_state() == dl4j_threshold().get_state()
    assert master.threshold_algorithm == shared_training_threshold()
    assert wrapped.encoder.post_processor.get_state() == master.residual_post_processor.get_state()
    assert wrapped.encoder.threshold_algorithm.threshold == pytest.approx(1e-3)
    assert wrapped.scale_momentum is False and master.scale_momentum is True
    _loss(model, 0).backward()
    wrapped.step()  # Adam's first step moves every element by about lr = 1e-3: some reach tau, not all
    assert 0 < wrapped.encoder.last_count < wrapped.num_params
    assert wrapped.param_groups[0]["betas"] == (0.9, 0.999) and wrapped.leave()["momentum"] == []
    with pytest.raises(SharingConfigError, match="scale_momentum: expected True or False, got 'yes'"):
        DistributedOptimizer(torch.optim.Adam(model.parameters()), model, join=False, scale_momentum="yes")


def test_device_encoding_gives_the_host_encodings_replica() -> None:
    """The device path (torch codec, an explicit residual, DeviceSharing's hooks; what a GPU worker runs)
    on CPU tensors against the host path (an implicit residual): as many messages, the same parameters
    but where a gap's rounding put an element on the other side of tau, and the same total movement
    (parameters plus residual)."""
    runs = []
    for on_device in (False, True):
        model = _model()
        opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False,
                                   threshold_algorithm=FixedThreshold(1e-3), device_encoding=on_device,
                                   step_from="shared")  # where the device path steps from
        for step in range(5):
            opt.zero_grad()
            _loss(model, step).backward()
            opt.step()
        runs.append((opt.flat_params.detach().clone(), opt.state_dict()["residual"], opt.messages))
    (host_params, host_residual, host_messages), (dev_params, dev_residual, dev_messages) = runs
    assert host_messages == dev_messages == 5
    differ = dev_params.numpy() != host_params.numpy()
    assert differ.mean() < 0.01
    np.testing.assert_allclose(np.abs(dev_params.numpy() - host_params.numpy())[differ], 1e-3, rtol=1e-3)
    np.testing.assert_allclose(dev_params.numpy() + dev_residual, host_params.numpy() + host_residual,
                               rtol=0, atol=1e-6)


def test_each_message_is_the_encoding_of_the_gap() -> None:
    """Forty AdamW steps (dense bitmaps first, then sparse messages), clipping every 5th step: each
    message is byte for byte ``encode_counted`` of the step buffer minus the live parameters, the live
    parameters move by exactly the decoded message, and a clipping step leaves the gap within 5 tau."""
    model = _model()
    opt = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), model, join=False,
                               threshold_algorithm=AdaptiveThreshold(3e-3, max_sparsity=0.05, decay=0.5))
    step_buffer, live = opt._buffers.step_flat.numpy(), opt.flat_params.numpy()
    forms, captured = [], {}
    opt.optimizer.register_step_post_hook(  # the step buffer stepped, the encoding not yet run
        lambda *_: captured.update(gap=step_buffer - live, live=live.copy(),
                                   tau=opt.encoder.threshold_algorithm.threshold))
    for step in range(40):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
        expected, _ = encode_counted(captured["gap"], captured["tau"])
        if expected is None:
            np.testing.assert_array_equal(live, captured["live"])
            continue
        forms.append(int(expected[3]))
        moved = captured["live"]
        decode(expected, moved)
        np.testing.assert_array_equal(live.view(np.uint32), moved.view(np.uint32))
        if (step + 1) % 5 == 0:
            assert np.abs(step_buffer - live).max() <= 5 * captured["tau"] * (1 + 1e-6)
    assert 1 in forms and 0 in forms and opt.messages == len(forms)


def test_a_refused_submit_takes_the_own_apply_back() -> None:
    """The node refuses the message (its send queue stayed full): the live parameters are back where they
    were (the update is not in this replica while the master never gets it) and the update stays in the
    residual, sent by the next step."""
    from psrv.transport.errors import SendQueueFullError

    class RefusingNode:
        def submit(self, message, **fields):
            raise SendQueueFullError("full")

    model = _model(grid=True)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, join=False,
                               threshold_algorithm=FixedThreshold(2.0**-10),
                               post_processor=NoResidualPostProcessor())
    live = opt.flat_params.numpy()
    before = live.copy()
    opt.node = RefusingNode()
    _loss(model, 0).backward()
    with pytest.raises(SendQueueFullError):
        opt.step()
    np.testing.assert_array_equal(live, before)  # on the grid: taken back exactly
    assert opt.messages == 0 and np.abs(opt.state_dict()["residual"]).max() >= 2.0**-10
    opt.node = None
    opt.zero_grad()
    _loss(model, 0).backward()
    opt.step()
    assert opt.messages == 1 and not np.array_equal(live, before)


def test_a_loaded_residual_is_where_the_model_computes_from() -> None:
    """step_from="own": after load_state_dict the model computes at the live parameters plus the loaded
    residual (the step buffer), so a resumed worker starts where its own steps had taken it."""
    model = _model()
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model, join=False)
    for step in range(3):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
    state = copy.deepcopy(opt.state_dict())
    assert np.abs(state["residual"]).max() > 0
    other_model = _model(seed=2)
    other_model.load_state_dict({k: v.clone() for k, v in opt.model.state_dict().items()})  # B's values
    other = DistributedOptimizer(torch.optim.Adam(other_model.parameters(), lr=1e-2), other_model, join=False)
    live = opt.flat_params.numpy().copy()
    with torch.no_grad():
        other.flat_params.copy_(torch.from_numpy(live))  # the replica as the saved worker had it
    other.load_state_dict(state)
    computed_with = torch.nn.utils.parameters_to_vector(other_model.parameters()).detach().numpy()
    np.testing.assert_array_equal(computed_with, other._buffers.step_flat.numpy())
    np.testing.assert_allclose(computed_with, live + state["residual"], rtol=0, atol=1e-6)
