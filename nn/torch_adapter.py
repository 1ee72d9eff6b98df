"""PyTorch behind the psrv.nn network contract (optional extra ``torch``).

``TorchNetwork`` wraps any ``torch.nn.Module``, a torch loss and a torch optimizer. Every parameter of
the module is re-pointed into ONE flat buffer (float32 or float64, the module's dtype; every gradient
into another), so on the CPU ``params`` is a NumPy view of the same memory torch computes with: the
decoder writes it, the encoder reads it, without copies. torch is imported lazily, so
``import psrv.nn`` works without it.

Devices: the network lives on one device (``device=``; by default the module's own, never moved
silently). The flat parameters, flat gradients, step buffer, optimizer state (and, on a Spark worker,
the residual and the encoding) all live there. ``params`` is the runtime contract: on the CPU it is the
live NumPy view of the flat buffer (no copy); on another device there is no host view, so ``params``,
``gradients``, ``updater_state``, ``get_buffers()``, ``compute_update`` and ``output`` return HOST
COPIES (each call copies). A device worker uses ``flat_params`` and ``compute_update_tensor`` instead,
which stay on the device (see psrv.spark.task.device).

Buffers that are not parameters (BatchNorm running statistics, counters) are network state too:
``get_buffers()``/``set_buffers()`` move them by name; Spark ships, returns and averages them, and
``save``/``load`` keep them.

``compute_update`` runs forward and backward on the live parameters, then ``optimizer.step()`` on a
separate *step buffer* (a second flat vector the optimizer owns, loaded with a copy of the live
parameters) and returns the difference as the update. It never writes ``params``: a node's I/O thread may
decode received updates into them at any moment of the step, and none is lost (the network contract
of DESIGN.md, "How an update travels"). Only ``set_params``, ``apply_update`` and the decoder write them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from psrv.nn import _inputs
from psrv.nn._files import read_whole, write_atomically
from psrv.nn.errors import ConfigError, InvalidInputError, ModelFileError, NonFiniteLossError
from psrv.nn.normalizers import normalizer_from_state
from psrv.nn.torch_device import import_torch, place_module, resolve_device, saved_device
from psrv.nn.torch_file import FORMAT, FORMAT_VERSION, dump_payload, load_payload
from psrv.nn.torch_flat import (
    bind_flat_buffers,
    computing_on_step_buffer,
    load_step_buffer,
    restore_grad_views,
    steer_to_step_buffer,
    step_before_after,
    take_step,
)
from psrv.nn.torch_io import Layout, evaluate_outputs, input_shapes, probe_input
from psrv.nn.torch_shapes import masked_steps_zeroed, predictions

log = logging.getLogger(__name__)


class TorchNetwork(_inputs.TrainingCounters):
    """An ``nn.Module`` + loss + optimizer with the same contract as ``psrv.nn.Network``.

    ``optimizer`` is a factory ``params -> torch.optim.Optimizer`` (default Adam(lr=1e-3)) or an optimizer
    already built on ``module.parameters()``. ``output_activation`` ("softmax", "sigmoid" or None) turns
    the module's raw outputs into what ``output()`` returns (logits for CrossEntropyLoss -> softmax).
    ``targets`` says what the loss takes: "onehot" float rows (default; CrossEntropyLoss accepts class
    probabilities) or "index" class indices (NLLLoss).

    Outputs of any shape with the batch first, ``input_shape`` with None for a varying length, and the
    features mask as ``forward(x, mask=...)``: see psrv.nn.torch_shapes.

    Several inputs or outputs (psrv.nn.torch_io): ``input_shape`` a list of shapes, one per parameter of
    ``forward``; ``forward`` returning a tuple/list of tensors; ``loss``, ``output_activation`` and
    ``targets`` one for all outputs or a sequence, one per output. Features and labels are then lists of
    arrays (a MultiDataSet's), ``output`` returns a list of arrays and ``evaluate`` one result per output.

    ``device``: None keeps the module where it is (its parameters must all be on one device, float32 or
    float64: that dtype is kept); "cpu", "cuda", "cuda:1" move the module there on purpose; "auto" picks
    the current CUDA device when CUDA is available, else the CPU, and logs which.
    """

    def __init__(
        self,
        module: Any,
        loss: Any,
        input_shape: Sequence[int] | Sequence[Sequence[int]] | int,
        optimizer: Any = None,
        output_activation: str | None | Sequence[str | None] = "softmax",
        targets: str | Sequence[str] = "onehot",
        seed: int | None = None,
        device: Any = None,
    ) -> None:
        torch = import_torch()
        if seed is not None:
            torch.manual_seed(int(seed))
        self.seed = int(seed) if seed is not None else 0  # shuffling in fit and in the Spark pipelines
        shapes, multi_input = input_shapes(input_shape)
        # one input: a tuple of ints, as always; several: a tuple of such shapes (saved as given)
        self.input_shape: tuple[Any, ...] = shapes if multi_input else shapes[0]
        self.device, torch_dtype = place_module(module, device)
        self.module = module
        self.loss_fn = loss
        self.output_activation = output_activation
        self.targets = targets
        self._torch_dtype = torch_dtype
        self.dtype = np.dtype(str(torch_dtype).removeprefix("torch."))
        self._bind_flat_buffers()
        if optimizer is None:
            optimizer = lambda ps: torch.optim.Adam(ps, lr=1e-3)  # noqa: E731
        if isinstance(optimizer, torch.optim.Optimizer):
            built = optimizer
        elif callable(optimizer):
            built = optimizer(self._step_params)
            if not isinstance(built, torch.optim.Optimizer):
                raise ConfigError(
                    f"optimizer: the factory must return a torch.optim.Optimizer, got {type(built).__name__}"
                )
        else:
            raise ConfigError(
                f"optimizer must be a torch Optimizer or a factory, got {type(optimizer).__name__}"
            )
        self.optimizer = steer_to_step_buffer(built, self._buffers)
        with torch.no_grad():
            was_training = module.training
            module.eval()
            probe = module(*(torch.zeros((1, *probe_input(shape)), dtype=torch_dtype, device=self.device)
                             for shape in shapes))
            module.train(was_training)
        self.layout = Layout.build(shapes, multi_input, probe, loss, output_activation, targets, module)
        self.num_outputs = self.layout.output_sizes[0]  # classes (class axis) of the (first) output
        self._iteration = 0
        self._epoch = 0
        self.normalizer: Any = None
        self.last_loss: float | None = None

    def _bind_flat_buffers(self) -> None:
        buffers = bind_flat_buffers(self.module, self._torch_dtype, self.device)
        self._buffers = buffers
        self._param_list, self._flat, self._flat_grad = buffers.params, buffers.flat, buffers.flat_grad
        self._grad_ptrs, self._params_np = buffers.grad_ptrs, buffers.host_view
        self._step_flat, self._step_params = buffers.step_flat, buffers.step_params

    # --- the flat vectors -------------------------------------------------------------------------

    @property
    def on_host(self) -> bool:
        """True when the network lives on the CPU: ``params`` is then the live memory, not a copy."""
        return self.device.type == "cpu"

    @property
    def params(self) -> np.ndarray:
        """The flat parameter vector: on the CPU the live view the module computes with; on another
        device a host COPY (use ``flat_params`` there)."""
        if self._params_np is not None:
            return self._params_np
        return self._flat.detach().cpu().numpy()

    @property
    def flat_params(self) -> Any:
        """The live flat parameter tensor on the network's device (what a device decoder writes)."""
        return self._flat

    @property
    def num_params(self) -> int:
        return int(self._flat.numel())

    @property
    def gradients(self) -> np.ndarray:
        return self._flat_grad.cpu().numpy() if not self.on_host else self._flat_grad.numpy()

    def _on_device(self, vec: Any, what: str) -> Any:
        torch = import_torch()
        tensor = vec if isinstance(vec, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(vec))
        if tuple(tensor.shape) != (self.num_params,):
            raise InvalidInputError(
                f"{what}: expected a flat vector of shape ({self.num_params},), "
                f"got shape {tuple(tensor.shape)}")
        return tensor.to(self.device)

    def set_params(self, params: Any) -> None:
        """Overwrite the parameters (a host array or a tensor; one host-to-device copy off the CPU)."""
        if self._params_np is not None and not _is_tensor(params):
            self._params_np[...] = _flat(params, self.num_params, "params")
            return
        with import_torch().no_grad():
            self._flat.copy_(self._on_device(params, "params"))

    def apply_update(self, update: Any) -> None:
        if self._params_np is not None and not _is_tensor(update):
            self._params_np += _flat(update, self.num_params, "update")
            return
        with import_torch().no_grad():
            self._flat.add_(self._on_device(update, "update"))

    # --- buffers (BatchNorm statistics, counters): state that is not a parameter ------------------------

    def get_buffers(self) -> dict[str, np.ndarray]:
        """Host copies of the module's buffers by name (running mean/var, num_batches_tracked ...)."""
        return {name: b.detach().cpu().numpy().copy() for name, b in self.module.named_buffers()}

    def set_buffers(self, buffers: Mapping[str, Any]) -> None:
        """Overwrite the module's buffers by name (the names must be exactly the module's). Values are
        cast to each buffer's dtype; integer counters are rounded (an average of counters may not be)."""
        torch = import_torch()
        own = dict(self.module.named_buffers())
        if set(buffers) != set(own):
            raise InvalidInputError(f"buffers: expected the names {sorted(own)}, got {sorted(buffers)}")
        with torch.no_grad():
            for name, target in own.items():
                value = np.asarray(buffers[name])
                if value.shape != tuple(target.shape):
                    raise InvalidInputError(
                        f"buffers: {name!r} has shape {tuple(target.shape)}, got {value.shape}")
                if not target.is_floating_point() and value.dtype.kind == "f":
                    value = np.rint(value)
                value = torch.from_numpy(np.array(value, copy=True)).to(target.dtype)
                target.copy_(value.reshape(target.shape))

    def _state_slots(self) -> list[tuple[dict, str, Any]]:
        slots = []
        for p in self._step_params:
            state = self.optimizer.state.get(p, {})
            for key in sorted(state):
                slots.append((state, key, state[key]))
        return slots

    @property
    def updater_state(self) -> np.ndarray:
        """The optimizer state flattened (per parameter, keys sorted): a COPY, empty before the first
        step. Step counters are included, so set_updater_state restores Adam's bias correction too."""
        torch = import_torch()
        parts = []
        for _, _, value in self._state_slots():
            if isinstance(value, torch.Tensor):
                parts.append(value.detach().reshape(-1).to(torch.float32).cpu().numpy())
            elif isinstance(value, int | float):
                parts.append(np.array([value], dtype=np.float32))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def set_updater_state(self, state: np.ndarray) -> None:
        torch = import_torch()
        vec = np.asarray(state, dtype=np.float32).reshape(-1)
        if vec.size and not self.optimizer.state:
            self._initialize_optimizer_state()
        slots = self._state_slots()
        sizes = [v.numel() if isinstance(v, torch.Tensor) else 1 for _, _, v in slots]
        if vec.size != sum(sizes):
            raise InvalidInputError(
                f"updater state: expected a flat vector of shape ({sum(sizes)},), got shape {vec.shape}"
            )
        offset = 0
        with torch.no_grad():
            for (container, key, value), n in zip(slots, sizes, strict=True):
                chunk = vec[offset : offset + n]
                if isinstance(value, torch.Tensor):
                    value.copy_(torch.from_numpy(chunk.copy()).reshape(value.shape).to(value.dtype))
                else:
                    container[key] = type(value)(chunk[0])
                offset += n

    def _initialize_optimizer_state(self) -> None:
        """Let the optimizer create its state with one zero-gradient step on the step buffer."""
        self._flat_grad.zero_()
        self.optimizer.step()

    # --- training ---------------------------------------------------------------------------------

    @property
    def multi_input(self) -> bool:
        """True when ``forward`` takes several tensors (features are then a list of arrays)."""
        return self.layout.multi_input

    @property
    def multi_output(self) -> bool:
        """True when ``forward`` returns several tensors (labels, masks, outputs are then lists)."""
        return self.layout.multi_output

    @property
    def output_sizes(self) -> tuple[int, ...]:
        return self.layout.output_sizes

    def _prepare(self, features: Any, labels: Any, mask: Any):
        """(inputs, labels, masks) as lists of checked host arrays (one item each without several)."""
        xs = self.layout.inputs(features, self.dtype)
        n = xs[0].shape[0]
        return xs, self.layout.labels(labels, n, self.dtype, xs), self.layout.masks(mask, n, self.dtype, xs)

    def _features_mask(self, mask: Any, n: int) -> Any:
        """The features mask as tensors for the module's ``mask`` keyword (None when it takes none)."""
        fm = self.layout.features_mask(mask, n, self.dtype)
        if isinstance(fm, list):
            return [None if m is None else self._tensor(m) for m in fm]
        return None if fm is None else self._tensor(fm)

    def _loss(self, outs: Any, ys: list[np.ndarray], masks: list[np.ndarray | None]) -> Any:
        return self.layout.total_loss(self.layout.outputs(outs), [self._tensor(y) for y in ys],
                                      [None if m is None else self._tensor(m) for m in masks])

    def _tensor(self, array: np.ndarray) -> Any:
        """A host batch as a tensor on the network's device (the only per-step host-to-device copy)."""
        tensor = import_torch().from_numpy(array)
        return tensor if self.on_host else tensor.to(self.device, non_blocking=False)

    def _gradient(self, xs: list[np.ndarray], ys: list[np.ndarray], masks: list[Any],
                  features_mask: Any = None) -> float:
        self._flat_grad.zero_()
        self.module.train()
        raw = self.layout.forward(self.module, [self._tensor(x) for x in xs],
                                  self._features_mask(features_mask, xs[0].shape[0]))
        loss = self._loss(raw, ys, masks)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise NonFiniteLossError(f"loss is {value} at iteration {self._iteration}: training diverged")
        loss.backward()
        restore_grad_views(self._buffers)
        return value

    def _gradient_from(self, xs: list[np.ndarray], ys: list[np.ndarray], masks: list[Any], features_mask: Any,
                       load: Any, from_loaded: bool) -> float:
        """``_gradient`` at the live parameters, or (``from_loaded``) at what ``load`` put in the step
        buffer."""
        if not from_loaded:
            return self._gradient(xs, ys, masks, features_mask)
        load_step_buffer(self._buffers, load)
        with computing_on_step_buffer(self._buffers):
            return self._gradient(xs, ys, masks, features_mask)

    def _local_steps(self, xs: list[np.ndarray], ys: list[np.ndarray], masks: list[Any], features_mask: Any,
                     load: Any, from_loaded: bool, pieces: int) -> tuple[float, bool]:
        """The gradient of the step about to be taken: (loss, whether the step buffer is loaded).

        With ``pieces`` > 1 the minibatch's rows are split into that many pieces (as ``np.array_split``
        does), each of two rows or more (a minibatch of fewer than 2 x ``pieces`` rows takes fewer: a
        piece of one row is one sample's step, and BatchNorm cannot train on it), and the optimizer steps
        the step buffer on all but the last in turn, each piece's gradient taken where the steps before it
        left the buffer; the caller's step is then the last piece's, so after - before is the sum of the
        pieces' steps. The loss is the pieces' mean, weighted by their rows. The live parameters are never
        written."""
        rows = int(xs[0].shape[0])
        pieces = max(1, min(int(pieces), rows // 2))
        if pieces == 1:
            return self._gradient_from(xs, ys, masks, features_mask, load, from_loaded), from_loaded
        load_step_buffer(self._buffers, load)  # the live parameters, or what ``load`` puts there
        sizes = [rows // pieces + (1 if k < rows % pieces else 0) for k in range(pieces)]  # np.array_split's
        bounds = np.cumsum([0, *sizes])
        total = 0.0
        with computing_on_step_buffer(self._buffers):
            for k, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                part = slice(int(start), int(stop))
                loss = self._gradient([x[part] for x in xs], [y[part] for y in ys],
                                      [None if m is None else m[part] for m in masks],
                                      _rows_of(features_mask, part))
                total += loss * (int(stop) - int(start))
                if k < pieces - 1:
                    self.optimizer.step()  # the step buffer moves; the last piece's step is the caller's
        return total / rows, True

    def compute_gradient(self, features: Any, labels: Any, mask: Any = None,
                         features_mask: Any = None) -> tuple[np.ndarray, float]:
        x, y, m = self._prepare(features, labels, mask)
        loss = self._gradient(x, y, m, features_mask)
        return self._flat_grad.cpu().numpy().copy(), loss

    def compute_update(self, features: Any, labels: Any, mask: Any = None,
                       features_mask: Any = None, local_steps: int = 1) -> tuple[np.ndarray, float]:
        """Forward, backward, optimizer.step(); returns (step to ADD, loss). Never writes ``params``.

        The step is a NumPy array: on the CPU without a copy, on another device a host copy (use
        ``compute_update_tensor`` to keep it on the device). ``local_steps=K`` takes K optimizer steps on
        K pieces of the minibatch in turn, each from where the last left the step buffer, and returns
        their sum (``SharedTrainingMaster(local_steps=)``: several steps a message).
        """
        update, loss = self.compute_update_tensor(features, labels, mask, features_mask,
                                                  local_steps=local_steps)
        return update.numpy() if self.on_host else update.cpu().numpy(), loss

    def compute_update_tensor(self, features: Any, labels: Any, mask: Any = None, features_mask: Any = None,
                              load: Any = None, from_loaded: bool = False,
                              local_steps: int = 1) -> tuple[Any, float]:
        """As ``compute_update``, the step as a tensor on the network's device (no host copy).

        The optimizer steps the step buffer, loaded first with one read of the live parameters (which
        the node's I/O thread may be changing: the step is then taken from a slightly older point, as
        in any asynchronous SGD, but every update decoded meanwhile stays in ``params``). With
        ``from_loaded`` the buffers are loaded first by ``load`` (as in ``compute_update_pair``) and the
        forward and backward pass run at what it put there. ``local_steps`` as in ``compute_update``.
        """
        x, y, m = self._prepare(features, labels, mask)
        loss, loaded = self._local_steps(x, y, m, features_mask, load, from_loaded, local_steps)
        if loaded:
            after, before, _ = step_before_after(self._buffers, self.optimizer, loaded=True)
            update = after - before
        else:
            update, _ = take_step(self._buffers, self.optimizer)
        self._iteration += 1
        self.last_loss = loss
        return update, loss

    def compute_update_pair(self, features: Any, labels: Any, mask: Any = None, features_mask: Any = None,
                            load: Any = None, from_loaded: bool = False,
                            local_steps: int = 1) -> tuple[np.ndarray, np.ndarray, float]:
        """On the CPU, ``compute_update`` with the step given as (parameters after, before) (views valid
        until the next step), so an encoder adds the difference inside its own pass; ``load`` as in
        ``torch_flat.load_step_buffer``. With ``from_loaded`` the buffers are loaded first and the forward
        and backward pass run at what ``load`` put there (e.g. the live parameters plus the worker's own
        residual), not at the live parameters; ``before`` is then that point. ``params`` is never
        written either way. ``local_steps`` as in ``compute_update``: ``after`` is where the last of them
        left the step buffer."""
        x, y, m = self._prepare(features, labels, mask)
        loss, loaded = self._local_steps(x, y, m, features_mask, load, from_loaded, local_steps)
        after, before, _ = step_before_after(self._buffers, self.optimizer, load=load, loaded=loaded)
        self._iteration += 1
        self.last_loss = loss
        return after.numpy(), before.numpy(), loss

    def fit(self, data: Any, epochs: int = 1, batch_size: int = 32, shuffle: bool = True) -> None:
        _inputs.fit_epochs(self, data, epochs, batch_size, shuffle)

    # --- inference --------------------------------------------------------------------------------

    def _raw_output(self, xs: list[np.ndarray], features_mask: Any = None) -> Any:
        torch = import_torch()
        self.module.eval()
        try:
            with torch.no_grad():
                return self.layout.forward(self.module, [self._tensor(x) for x in xs],
                                           self._features_mask(features_mask, xs[0].shape[0]))
        finally:
            self.module.train()

    def _outputs(self, xs: list[np.ndarray], features_mask: Any = None) -> list[np.ndarray]:
        outs = self.layout.activate(self.layout.outputs(self._raw_output(xs, features_mask)))
        return [out.cpu().numpy() for out in outs]

    def output(self, features: Any, mask: Any = None) -> Any:
        """The outputs (activated) in the module's shape: an array, or a list of arrays for a module of
        several outputs. ``mask``, a features mask, reaches the module (when ``forward`` takes ``mask``)
        and zeroes the masked steps of a sequence output (n, T, k)."""
        xs = self.layout.inputs(features, self.dtype)
        outs = self._outputs(xs, mask)
        if mask is not None and not self.multi_input:
            outs = [masked_steps_zeroed(out, np.asarray(mask)) for out in outs]
        return outs if self.multi_output else outs[0]

    def predict(self, features: Any) -> Any:
        """Class indices per output, the class axis removed (a list for a module of several outputs)."""
        outs = self.output(features)
        listed = outs if self.multi_output else [outs]
        preds = [predictions(out, activation, axis) for out, activation, axis
                 in zip(listed, self.layout.activations, self.layout.class_axes, strict=True)]
        return preds if self.multi_output else preds[0]

    def score(self, data: Any, batch_size: int = 4096) -> float:
        """Mean loss per example (the sum of the outputs' losses for a module of several outputs)."""
        total, count = 0.0, 0
        for features, labels, mask, fm in _inputs.masked_minibatches(data, batch_size, None):
            xs, ys, ms = self._prepare(features, labels, mask)
            total += float(self._loss(self._raw_output(xs, fm), ys, ms)) * xs[0].shape[0]
            count += xs[0].shape[0]
        if count == 0:
            raise InvalidInputError("score: expected at least one example, got none")
        return total / count

    def evaluate(self, data: Any, evaluation: Any = None, batch_size: int = 4096) -> Any:
        """Classification metrics (or ``evaluation``'s). A module of several outputs is evaluated per
        output: a PerOutput (or a list of evaluations, one per output; default: classification for
        softmax/sigmoid outputs, regression otherwise) is returned; one evaluation object evaluates the
        first output only."""
        return evaluate_outputs(self, data, evaluation, batch_size)

    # --- copies and files ---------------------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        """Descriptive only (an nn.Module is code, not data): use to_bytes/from_bytes to ship one."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "module": repr(self.module),
            "loss": repr(self.loss_fn),
            "optimizer": type(self.optimizer).__name__,
            "input_shape": [list(s) for s in self.input_shape] if self.multi_input
            else list(self.input_shape),
            "output_activation": self.output_activation,
            "targets": self.targets,
        }

    def to_bytes(self, pickle_module: Any = None) -> bytes:
        """The file form. ``pickle_module`` (e.g. cloudpickle) lets code defined in ``__main__`` or a
        notebook travel by value (what psrv.spark does to ship a network to its executors)."""
        payload = {
            "module": self.module,
            "loss": self.loss_fn,
            "optimizer_class": type(self.optimizer),
            "optimizer_defaults": self.optimizer.defaults,
            "optimizer_state": self.optimizer.state_dict(),
            "input_shape": self.input_shape,
            "output_activation": self.output_activation,
            "targets": self.targets,
            "iteration": self._iteration,
            "epoch": self._epoch,
            "device": str(self.device),
            "normalizer": self.normalizer.get_state() if self.normalizer is not None else None,
        }
        return dump_payload(payload, pickle_module)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, source: str = "buffer",
                   device: Any = None) -> TorchNetwork:
        """Rebuild a network (module, buffers, optimizer state, counters) from ``to_bytes``.

        ``device`` as in the constructor; None restores the device it was saved from when that exists
        here, else the CPU (logged), so a file saved on a GPU host loads on a CPU-only one.
        """
        payload = load_payload(data, source)
        optimizer_class, defaults = payload["optimizer_class"], payload["optimizer_defaults"]
        net = cls(
            payload["module"], payload["loss"], payload["input_shape"],
            optimizer=lambda ps: optimizer_class(ps, **defaults),
            output_activation=payload["output_activation"], targets=payload["targets"],
            device=device if device is not None else saved_device(payload.get("device", "cpu"), source),
        )
        net.optimizer.load_state_dict(payload["optimizer_state"])
        net._iteration, net._epoch = payload["iteration"], payload["epoch"]
        if payload.get("normalizer") is not None:
            net.normalizer = normalizer_from_state(payload["normalizer"])
        return net

    def save(self, path: Any) -> None:
        write_atomically(path, self.to_bytes())

    @classmethod
    def load(cls, path: Any, device: Any = None) -> TorchNetwork:
        try:
            data = read_whole(path)
        except OSError as exc:
            raise ModelFileError(f"cannot read TorchNetwork file {path!r}: {exc}") from exc
        return cls.from_bytes(data, source=str(path), device=device)

    def clone(self) -> TorchNetwork:
        return TorchNetwork.from_bytes(self.to_bytes(), device=self.device)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # pickling goes through the file form, so the copy re-binds its own flat buffer
        return (TorchNetwork.from_bytes, (self.to_bytes(),))


def _rows_of(features_mask: Any, rows: slice) -> Any:
    """The rows ``rows`` of a features mask as ``compute_update`` takes it (None, an array, or a list of
    them, one per input)."""
    if features_mask is None:
        return None
    if isinstance(features_mask, (list, tuple)):
        return [None if m is None else m[rows] for m in features_mask]
    return features_mask[rows]


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "device")


def _flat(vec: Any, size: int, what: str) -> np.ndarray:
    arr = np.asarray(vec)
    if arr.shape != (size,):
        raise InvalidInputError(f"{what}: expected a flat vector of shape ({size},), got shape {arr.shape}")
    return arr


__all__ = ["TorchNetwork", "resolve_device"]
