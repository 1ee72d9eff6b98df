"""N workers of gradient sharing in one process, beside the methods it is measured against.

Every method sees the same data in the same order: an epoch's permutation is cut into rounds of
``workers`` minibatches; in round r worker w trains on minibatch ``r * workers + w``. One process
trains on those minibatches one after the other (``workers`` steps per round), synchronous averaging
averages the ``workers`` gradients of a round into one step (what DDP computes), parameter averaging
lets every worker step alone and averages parameters and optimizer state every ``period`` rounds.

Gradient sharing uses psrv's real parts: a ``TorchNetwork`` per worker (its step buffer), a
``ResidualEncoder`` per worker with the given threshold algorithm and residual post-processor, the
numba codec, and the apply order of a node: a worker decodes its own message into its replica at
once; the others decode it ``delay`` rounds later (plus up to ``jitter`` more, drawn per receiver),
after the round's computation. After the last round every pending message is delivered (the drain),
and every replica is compared with the master copy (the initial parameters plus every message). With
``own_point`` a worker steps from its replica plus its residual (what it has not sent yet), as psrv's
default ``step_from="own"`` does, and evaluations during the run see that point; the final accuracy is
the master copy's.

``compressed_gradients`` shares gradients instead of steps, for comparison: each worker
threshold-encodes its gradient and every replica steps one optimizer on the mean of the decoded
messages.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from psrv.encoding import (
    ResidualEncoder,
    SampledQuantileThreshold,
    compact,
    decode,
    encode_counted,
    message_info,
)
from psrv.nn import TorchNetwork
from psrv.nn.momentum import momentum_for_workers, start_square_averages
from torch import nn

from quality.tasks import Task

__all__ = ["FlushingQuantile", "Result", "Setting", "Sharing", "batches", "compressed_gradients",
           "flush_threshold", "network", "one_process", "parameter_averaging", "sharing", "synchronous"]

Factory = Callable[[], Any]

#: each optimizer's learning rate where a run does not set one (SGD and RMSprop with momentum 0.9)
DEFAULT_LR = {"adam": 1e-3, "sgd": 0.01, "rmsprop": 1e-4}


@dataclass
class Setting:
    """What every method of one comparison shares: optimizer, workers, seed, how often to evaluate."""

    optimizer: str = "adam"  # "adam" (lr 1e-3), "sgd" (momentum 0.9, lr 0.01), "rmsprop" (the same, 1e-4)
    workers: int = 2
    seed: int = 0
    lr: float | None = None
    evals: int = 12  # evaluations of the test accuracy over the run (for steps to target)
    target: float | None = None  # test accuracy that counts as reached
    test_rows: int = 4000
    momentum: float = 0.9  # SGD's and RMSprop's (0: none, e.g. plain SGD, whose workers keep no state)

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        if self.optimizer not in DEFAULT_LR:
            raise ValueError(f"optimizer: expected 'adam', 'sgd' or 'rmsprop', got {self.optimizer!r}")
        lr = self.lr or DEFAULT_LR[self.optimizer]
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr)
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=self.momentum)
        return torch.optim.RMSprop(params, lr=lr, momentum=self.momentum)


@dataclass
class Sharing:
    """Gradient sharing's knobs: the encoder's strategy objects (factories, one per worker), the codec
    ("threshold": psrv's; "exact": the update itself, a control without quantization), the delay."""

    threshold: Factory | None = None
    post_processor: Factory | None = None
    codec: str = "threshold"
    delay: int = 0
    jitter: int = 0
    flush_end: int = 0  # messages per worker after the last round that carry its residual out
    masking: bool = False  # momentum factor masking: clear the optimizer's momentum where sent
    own_point: bool = False  # steps from the replica plus the worker's residual (step_from="own")
    scale_momentum: bool = False  # each worker's momentum = given ** workers (psrv.nn.momentum)
    # with scale_momentum: RMSprop's square average starts at the first gradient's square (as the product
    # does), else at zero as torch starts it
    square_start: bool = True
    # the workers of a round step one after the other, each after what the workers before it in the
    # round sent has arrived (with delay 0); else every worker of a round steps from the same point
    interleave: bool = False
    # optimizer steps per message: a worker splits its minibatch into this many pieces, steps on each in
    # turn from where the last left it, and encodes the sum of the steps as one message
    local_steps: int = 1
    # rounds per message: a worker sends one message every this many rounds (and in the last); in between
    # its steps only join its residual, which moves the point it steps from (own_point) and waits for
    # the next message: fewer messages, so less of the fixed cost every message carries on the wire
    message_period: int = 1


@dataclass
class Result:
    """What one run measured. Steps are per worker (rounds), except one process's (its own steps)."""

    method: str
    accuracy: float
    steps: int
    curve: list[tuple[int, float]] = field(default_factory=list)
    bytes_total: int = 0
    bytes_unpacked: int = 0  # the same messages in the encoder's own form (sparse or bitmap), unpacked
    bytes_first100: int = 0  # per worker, the first 100 steps
    dense_per_step: int = 0  # bytes of one dense update of one worker
    bitmaps_after3: int = 0
    steady_per_step: float = 0.0  # per worker and step, after the first 100 steps (or the second half)
    replica_gap: float = 0.0  # max |replica - master copy| after the drain
    params: np.ndarray | None = None
    residuals: list[np.ndarray] | None = None  # sharing: each worker's residual after the last round

    def steps_to(self, target: float) -> int | None:
        return next((step for step, acc in self.curve if acc >= target), None)

    @property
    def first100_ratio(self) -> float:
        per_step = self.bytes_first100 / max(1, min(100, self.steps))
        return per_step / self.steady_per_step if self.steady_per_step else float("nan")


def batches(task: Task, setting: Setting) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """The rounds of every epoch: a list of rounds, each a list of ``workers`` (x, y) minibatches."""
    n, b, w = len(task.y_train), task.batch_size, setting.workers
    rounds = []
    for epoch in range(task.epochs):
        order = np.random.default_rng([setting.seed, epoch, 7]).permutation(n)
        for r in range(n // (b * w)):
            rounds.append([(task.x_train[order[(r * w + k) * b:(r * w + k + 1) * b]],
                            task.y_train[order[(r * w + k) * b:(r * w + k + 1) * b]]) for k in range(w)])
    return rounds


def initial_module(task: Task, setting: Setting, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(setting.seed)
    return task.build().to(dtype)


def accuracy(module: nn.Module, task: Task, setting: Setting) -> float:
    x = torch.from_numpy(task.x_test[:setting.test_rows])
    was = module.training
    module.eval()
    with torch.no_grad():
        dtype = next(module.parameters()).dtype
        predicted = module(x.to(dtype)).argmax(1).numpy()
    module.train(was)
    return float((predicted == task.y_test[:setting.test_rows]).mean())


def _eval_points(total: int, evals: int) -> set[int]:
    return {max(1, round(total * (i + 1) / evals)) for i in range(evals)}


def _tensors(x: np.ndarray, y: np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(x).to(dtype), torch.from_numpy(y)


def _flat(module: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy().copy()


def one_process(task: Task, setting: Setting, dtype: torch.dtype = torch.float32) -> Result:
    """One module and optimizer over every minibatch in order (``workers`` steps per round)."""
    module = initial_module(task, setting, dtype)
    optimizer = setting.make_optimizer(module.parameters())
    rounds = batches(task, setting)
    total = len(rounds) * setting.workers
    points, curve, step = _eval_points(total, setting.evals * setting.workers), [], 0
    for round_ in rounds:
        for x, y in round_:
            xt, yt = _tensors(x, y, dtype)
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(xt), yt).backward()
            optimizer.step()
            step += 1
            if step in points:
                curve.append((step, accuracy(module, task, setting)))
    return Result("one process", accuracy(module, task, setting), total, curve, params=_flat(module))


def synchronous(task: Task, setting: Setting, dtype: torch.dtype = torch.float32) -> Result:
    """Synchronous data parallelism: the mean of the round's ``workers`` gradients, one step per round.

    The replicas of DDP stay equal, so one module stands for all of them; each worker's gradient is
    computed on its own minibatch and the mean is what the all-reduce gives every replica.
    """
    module = initial_module(task, setting, dtype)
    optimizer = setting.make_optimizer(module.parameters())
    params = list(module.parameters())
    rounds = batches(task, setting)
    points, curve = _eval_points(len(rounds), setting.evals), []
    size = sum(p.numel() for p in params)
    for r, round_ in enumerate(rounds, 1):
        summed = [torch.zeros_like(p) for p in params]
        for x, y in round_:
            xt, yt = _tensors(x, y, dtype)
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(xt), yt).backward()
            for s, p in zip(summed, params, strict=True):
                s += p.grad
        for s, p in zip(summed, params, strict=True):
            p.grad = s / len(round_)
        optimizer.step()
        if r in points:
            curve.append((r, accuracy(module, task, setting)))
    dense = size * params[0].element_size()
    return Result("sync averaging", accuracy(module, task, setting), len(rounds), curve,
                  bytes_total=dense * setting.workers * len(rounds),
                  bytes_first100=dense * min(100, len(rounds)), dense_per_step=dense,
                  steady_per_step=float(dense), params=_flat(module))


def compressed_gradients(task: Task, setting: Setting, config: Sharing | None = None,
                         name: str = "compressed gradients", dtype: torch.dtype = torch.float32) -> Result:
    """Gradient compression with one optimizer: each worker threshold-encodes its gradient (its own
    residual keeps what was not sent, error feedback) and every replica steps the same optimizer on
    the mean of the round's decoded messages. In lock-step rounds every replica sees the same
    messages, so one module stands for all of them. With ``config.codec == "exact"`` nothing is
    quantized and this is synchronous averaging."""
    config = config or Sharing()
    module = initial_module(task, setting, dtype)
    optimizer = setting.make_optimizer(module.parameters())
    params = list(module.parameters())
    size = sum(p.numel() for p in params)
    np_dtype = _flat(module).dtype
    encoders = _encoders(config, setting.workers, size, np_dtype)
    rounds = batches(task, setting)
    points, curve = _eval_points(len(rounds), setting.evals), []
    sent = np.zeros(len(rounds), dtype=np.int64)
    for r, round_ in enumerate(rounds):
        total = np.zeros(size, dtype=np_dtype)
        for w, (x, y) in enumerate(round_):
            xt, yt = _tensors(x, y, dtype)
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(xt), yt).backward()
            gradient = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
            if config.codec == "exact":
                total += gradient
                sent[r] += gradient.nbytes
                continue
            message = encoders[w].encode_update(gradient)
            if message is not None:
                decode(message, total)
                sent[r] += compact(message).nbytes
        total /= len(round_)
        offset = 0
        for p in params:
            p.grad = torch.from_numpy(total[offset:offset + p.numel()].copy()).view_as(p)
            offset += p.numel()
        optimizer.step()
        if r + 1 in points:
            curve.append((r + 1, accuracy(module, task, setting)))
    return Result(name, accuracy(module, task, setting), len(rounds), curve, params=_flat(module),
                  **_sent_bytes(sent, setting.workers, size * np_dtype.itemsize))


def _encoders(config: Sharing, workers: int, size: int, dtype: np.dtype) -> list[ResidualEncoder]:
    """One encoder per worker, each with its own threshold algorithm and post-processor from
    ``config``'s factories."""
    return [ResidualEncoder(size, dtype=dtype,
                            threshold_algorithm=config.threshold() if config.threshold else None,
                            post_processor=config.post_processor() if config.post_processor else None)
            for _ in range(workers)]


def _sent_bytes(sent: np.ndarray, workers: int, dense: int) -> dict[str, Any]:
    """``Result``'s byte fields from the bytes sent in each round by all ``workers``: the total, the
    first 100 steps per worker, and the steady state per worker and step (after the first 100 steps,
    or the second half of a shorter run)."""
    n = len(sent)
    steady = sent[100:] if n > 200 else sent[n // 2:]
    return {"bytes_total": int(sent.sum()), "bytes_first100": int(sent[:100].sum()) // workers,
            "dense_per_step": dense,
            "steady_per_step": float(steady.mean()) / workers if len(steady) else 0.0}


def _average_optimizers(optimizers: list[torch.optim.Optimizer]) -> None:
    groups = [o.param_groups[0]["params"] for o in optimizers]
    for i in range(len(groups[0])):
        states = [o.state[g[i]] for o, g in zip(optimizers, groups, strict=True)]
        for key, value in states[0].items():
            if isinstance(value, torch.Tensor) and value.dtype.is_floating_point and value.numel() > 1:
                mean = torch.stack([s[key] for s in states]).mean(0)
                for s in states:
                    s[key].copy_(mean)


def parameter_averaging(task: Task, setting: Setting, period: int = 5,
                        dtype: torch.dtype = torch.float32) -> Result:
    """Every worker steps alone; every ``period`` rounds parameters and optimizer state are averaged."""
    base = initial_module(task, setting, dtype)
    modules = [copy.deepcopy(base) for _ in range(setting.workers)]
    optimizers = [setting.make_optimizer(m.parameters()) for m in modules]
    rounds = batches(task, setting)
    points, curve = _eval_points(len(rounds), setting.evals), []
    size = sum(p.numel() for p in base.parameters())
    averages = 0
    for r, round_ in enumerate(rounds, 1):
        for module, optimizer, (x, y) in zip(modules, optimizers, round_, strict=True):
            xt, yt = _tensors(x, y, dtype)
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(xt), yt).backward()
            optimizer.step()
        if r % period == 0 or r == len(rounds):
            with torch.no_grad():
                for ps in zip(*(m.parameters() for m in modules), strict=True):
                    mean = torch.stack([p for p in ps]).mean(0)
                    for p in ps:
                        p.copy_(mean)
            _average_optimizers(optimizers)
            averages += 1
        if r in points:
            curve.append((r, accuracy(modules[0], task, setting)))
    state = sum(v.numel() for s in optimizers[0].state.values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.numel() > 1)
    dense = size * base.parameters().__next__().element_size()
    shipped = (size + state) * 4  # parameters and updater state, each way counted once
    return Result(f"param averaging/{period}", accuracy(modules[0], task, setting), len(rounds), curve,
                  bytes_total=shipped * setting.workers * averages,
                  bytes_first100=shipped * min(100, len(rounds)) // period, dense_per_step=dense,
                  steady_per_step=shipped / period, params=_flat(modules[0]))


def network(module: nn.Module, task: Task, setting: Setting) -> TorchNetwork:
    """A worker's ``TorchNetwork`` of ``module``, with the setting's optimizer."""
    return TorchNetwork(module, nn.CrossEntropyLoss(), task.input_shape, optimizer=setting.make_optimizer)


def _onehot(y: np.ndarray, classes: int, dtype: np.dtype) -> np.ndarray:
    out = np.zeros((len(y), classes), dtype=dtype)
    out[np.arange(len(y)), y] = 1
    return out


def sharing(task: Task, setting: Setting, config: Sharing | None = None, name: str = "sharing",
            dtype: torch.dtype = torch.float32) -> Result:
    """Gradient sharing among ``setting.workers`` TorchNetworks, simulated round by round."""
    config = config or Sharing()
    if config.message_period > 1 and (config.codec != "threshold" or not config.own_point):
        raise ValueError("message_period > 1 needs the threshold codec and own_point: the steps between two "
                         "messages wait in the residual, which only the own point steps from")
    base = initial_module(task, setting, dtype)
    nets = [network(copy.deepcopy(base), task, setting) for _ in range(setting.workers)]
    if config.scale_momentum:
        for net in nets:
            momentum_for_workers(net, setting.workers)
            if not config.square_start:
                start_square_averages(net.optimizer, False)
    size, np_dtype = nets[0].num_params, nets[0].params.dtype
    master = nets[0].params.copy()
    encoders = _encoders(config, len(nets), size, np_dtype)
    rng = np.random.default_rng([setting.seed, 11])
    pending: list[list[tuple[int, Any]]] = [[] for _ in nets]  # per receiver: (due round, message)
    rounds = batches(task, setting)
    points, curve = _eval_points(len(rounds), setting.evals), []
    sent = np.zeros(len(rounds), dtype=np.int64)
    unpacked = 0
    bitmaps = 0
    # own_point: each worker's replica (what was sent), apart from the point it steps from (the replica
    # plus its residual), as a Spark task with step_from="own" keeps them
    shared = [net.params.copy() for net in nets] if config.own_point else None
    for r, round_ in enumerate(rounds):
        for w, (net, encoder, (x, y)) in enumerate(zip(nets, encoders, round_, strict=True)):
            if config.interleave:  # what the workers before this one sent in this round is due now
                _deliver(net.params if shared is None else shared[w], pending[w], r - 1, config.codec)
            if shared is not None:
                np.add(shared[w], encoder.residual, out=net.params)
            update = _worker_step(net, x.astype(np_dtype), _onehot(y, task.classes, np_dtype),
                                  config.local_steps)
            if config.message_period > 1 and (r + 1) % config.message_period and r + 1 < len(rounds):
                encoder.residual += update
                continue
            if config.codec == "exact":
                message: Any = update.copy()
                _apply(net.params, message, config.codec)
            else:
                message = encoder.encode_update(update)
                if message is None:
                    continue
                decode(message, net.params if shared is None else shared[w])
                if config.masking:
                    _mask_momentum(net, message)
                bitmaps += int(r >= 3 and message_info(message).form == "bitmap")
                unpacked += message.nbytes
                message = compact(message)  # what a node sends: the bytes are the wire's
            sent[r] += message.nbytes
            _apply(master, message, config.codec)
            for v in range(len(nets)):
                if v != w:
                    due = r + config.delay + (int(rng.integers(0, config.jitter + 1)) if config.jitter else 0)
                    later = config.interleave and v > w  # it steps after this worker in this round
                    pending[v].append((due - 1 if later else due, message))
        for v, net in enumerate(nets):
            _deliver(net.params if shared is None else shared[v], pending[v], r, config.codec)
        if r + 1 in points:
            if shared is not None:
                np.add(shared[0], encoders[0].residual, out=nets[0].params)
            curve.append((r + 1, accuracy(nets[0].module, task, setting)))
    for _ in range(config.flush_end if config.codec != "exact" else 0):
        for w, (net, encoder) in enumerate(zip(nets, encoders, strict=True)):
            message = _flush(encoder)
            if message is None:
                continue
            decode(message, net.params if shared is None else shared[w])
            bitmaps += int(message_info(message).form == "bitmap")
            unpacked += message.nbytes
            message = compact(message)
            sent[-1] += message.nbytes
            _apply(master, message, config.codec)
            for v in range(len(nets)):
                if v != w:
                    pending[v].append((len(rounds), message))
    for v, net in enumerate(nets):  # the drain: everything still in flight arrives
        _deliver(net.params if shared is None else shared[v], pending[v], None, config.codec)
        if shared is not None:  # what was never sent leaves the replica: it is the master copy again
            net.params[:] = shared[v]
    gap = max(float(np.max(np.abs(net.params - master))) for net in nets)
    return Result(name, accuracy(nets[0].module, task, setting), len(rounds), curve,
                  bytes_unpacked=unpacked, bitmaps_after3=bitmaps, replica_gap=gap,
                  params=nets[0].params.copy(), residuals=[encoder.residual.copy() for encoder in encoders],
                  **_sent_bytes(sent, setting.workers, size * np_dtype.itemsize))


def _worker_step(net: TorchNetwork, x: np.ndarray, y: np.ndarray, pieces: int) -> np.ndarray:
    """A worker's update on its minibatch: one optimizer step, or ``pieces`` steps on the minibatch's
    pieces in turn (each from where the last left the worker's point) summed; the point is restored."""
    if pieces <= 1:
        return net.compute_update(x, y)[0]
    start = net.params.copy()
    total = np.zeros_like(start)
    for xp, yp in zip(np.array_split(x, pieces), np.array_split(y, pieces), strict=True):
        step, _ = net.compute_update(xp, yp)
        total += step
        net.apply_update(step)
    net.set_params(start)
    return total


def flush_threshold(residual: np.ndarray, sample: int = 65536) -> float | None:
    """The tau at which one message takes the most of ``residual``'s squared norm out (None for a
    residual of zeros): every element with |r| >= tau moves by tau, which removes 2 tau |r| - tau^2 of
    its square; the best tau over a strided sample. A low tau, so the message is usually a bitmap (1/16
    of a dense vector's bytes) carrying the sign of most of the residual."""
    picked = np.abs(residual[::max(1, -(-len(residual) // sample))]).astype(np.float64)
    ordered = np.sort(picked[np.isfinite(picked) & (picked > 0)])[::-1]
    if len(ordered) == 0:
        return None
    gain = 2 * ordered * np.cumsum(ordered) - np.arange(1, len(ordered) + 1) * ordered ** 2
    return float(ordered[int(np.argmax(gain))])


class FlushingQuantile(SampledQuantileThreshold):
    """The quantile tau, except every ``every``-th step, which takes ``flush_threshold``'s: no element's
    update waits more than ``every`` steps in the residual (a bitmap message every ``every`` steps)."""

    def __init__(self, every: int, sparsity: float = 9e-3) -> None:
        super().__init__(sparsity)
        self.every = every

    def prepare(self, residual: Any) -> None:
        if (self.steps + 1) % self.every:
            super().prepare(residual)
            return
        self.steps += 1
        tau = flush_threshold(residual, self.sample)
        if tau is not None:
            self.threshold = tau


def _flush(encoder: ResidualEncoder) -> Any:
    """One message at the tau that removes the most of the residual's squared norm."""
    tau = flush_threshold(encoder.residual)
    if tau is None:
        return None
    message, _ = encode_counted(encoder.residual, tau)
    return message


def _mask_momentum(net: TorchNetwork, message: Any) -> None:
    """Deep Gradient Compression's momentum factor masking: where an element was sent, the momentum
    (SGD's buffer, Adam's first moment) starts again from zero."""
    sent = np.zeros(net.num_params, dtype=net.params.dtype)
    decode(message, sent)
    offset = 0
    for p in net._step_params:
        n = p.numel()
        state = net.optimizer.state.get(p, {})
        buf = state.get("momentum_buffer", state.get("exp_avg"))
        if buf is not None:
            hit = torch.from_numpy(sent[offset:offset + n] != 0).view_as(buf)
            buf.masked_fill_(hit, 0)
        offset += n


def _apply(target: np.ndarray, message: Any, codec: str) -> None:
    if codec == "exact":
        target += message
    else:
        decode(message, target)


def _deliver(params: np.ndarray, queue: list[tuple[int, Any]], round_: int | None, codec: str) -> None:
    keep = []
    for due, message in queue:
        if round_ is None or due <= round_:
            _apply(params, message, codec)
        else:
            keep.append((due, message))
    queue[:] = keep
