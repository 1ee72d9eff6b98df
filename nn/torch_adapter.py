"""PyTorch behind the psrv.nn network contract (optional extra ``torch``).

``TorchNetwork`` wraps any ``torch.nn.Module``, a torch loss and a torch optimizer. Every parameter of
the module is re-pointed into ONE flat float32 buffer (and every gradient into another), so ``params``
is a NumPy view of the same memory torch computes with: the decoder writes it, the encoder reads it,
without copies. torch is imported lazily, so ``import psrv.nn`` works without it.

``compute_update`` runs forward and backward on the live parameters, then ``optimizer.step()`` on a
separate *step buffer* (a second flat vector the optimizer owns, loaded with a copy of the live
parameters) and returns the difference as the update. It never writes ``params``: a node's I/O thread may
decode received updates into them at any moment of the step, and none is lost (the network contract
of DESIGN.md, "How an update travels"). Only ``set_params``, ``apply_update`` and the decoder write them.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from psrv.nn import _inputs
from psrv.nn._files import write_atomically
from psrv.nn.errors import ConfigError, InvalidInputError, ModelFileError, NonFiniteLossError
from psrv.nn.eval_classification import Evaluation
from psrv.nn.normalizers import normalizer_from_state

FORMAT = "psrv.nn.TorchNetwork"
FORMAT_VERSION = 1
_OUTPUT_ACTIVATIONS = (None, "softmax", "sigmoid")


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ConfigError("TorchNetwork needs PyTorch: pip install 'psrv[torch]'") from exc
    return torch


class TorchNetwork(_inputs.TrainingCounters):
    """An ``nn.Module`` + loss + optimizer with the same contract as ``psrv.nn.Network``.

    ``optimizer`` is a factory ``params -> torch.optim.Optimizer`` (default Adam(lr=1e-3)) or an optimizer
    already built on ``module.parameters()``. ``output_activation`` ("softmax", "sigmoid" or None) turns
    the module's raw outputs into what ``output()`` returns (logits for CrossEntropyLoss -> softmax).
    ``targets`` says what the loss takes: "onehot" float rows (default; CrossEntropyLoss accepts class
    probabilities) or "index" class indices (NLLLoss).
    """

    def __init__(
        self,
        module: Any,
        loss: Any,
        input_shape: Sequence[int] | int,
        optimizer: Any = None,
        output_activation: str | None = "softmax",
        targets: str = "onehot",
        seed: int | None = None,
    ) -> None:
        torch = _torch()
        if seed is not None:
            torch.manual_seed(int(seed))
        self.seed = int(seed) if seed is not None else 0  # shuffling in fit and in the Spark pipelines
        if isinstance(input_shape, int | np.integer):
            input_shape = (int(input_shape),)
        self.input_shape = tuple(int(s) for s in input_shape)
        if output_activation not in _OUTPUT_ACTIVATIONS:
            raise ConfigError(
                f"output_activation must be one of {_OUTPUT_ACTIVATIONS}, got {output_activation!r}"
            )
        if targets not in ("onehot", "index"):
            raise ConfigError(f"targets must be 'onehot' or 'index', got {targets!r}")
        self.module = module
        self.loss_fn = loss
        self.output_activation = output_activation
        self.targets = targets
        self.dtype = np.dtype(np.float32)
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
        self.optimizer = self._steer_to_step_buffer(built)
        with torch.no_grad():
            was_training = module.training
            module.eval()
            probe = module(torch.zeros((1, *self.input_shape)))
            module.train(was_training)
        if probe.ndim != 2:
            raise ConfigError(f"the module must output (n, k) rows, got shape {tuple(probe.shape)}")
        self.num_outputs = int(probe.shape[1])
        self._iteration = 0
        self._epoch = 0
        self.normalizer: Any = None
        self.last_loss: float | None = None

    def _bind_flat_buffers(self) -> None:
        torch = _torch()
        self._param_list = [p for p in self.module.parameters() if p.requires_grad]
        total = sum(p.numel() for p in self._param_list)
        self._flat = torch.zeros(total, dtype=torch.float32)
        self._flat_grad = torch.zeros(total, dtype=torch.float32)
        offset = 0
        self._grad_ptrs = []
        with torch.no_grad():
            for p in self._param_list:
                n = p.numel()
                self._flat[offset : offset + n].copy_(p.detach().reshape(-1).to(torch.float32))
                p.data = self._flat[offset : offset + n].view_as(p)
                p.grad = self._flat_grad[offset : offset + n].view_as(p)
                self._grad_ptrs.append(p.grad.data_ptr())
                offset += n
        self._params_np = self._flat.numpy()
        # the optimizer's own copy of the parameters: it steps these, never the live ones, and reads the
        # same gradient memory (each step parameter's .grad is the live parameter's gradient view)
        self._step_flat = self._flat.clone()
        self._step_params = []
        offset = 0
        for p in self._param_list:
            n = p.numel()
            shadow = torch.nn.Parameter(self._step_flat[offset : offset + n].view_as(p))
            shadow.grad = p.grad
            self._step_params.append(shadow)
            offset += n

    def _steer_to_step_buffer(self, optimizer: Any) -> Any:
        """Point an optimizer built on the module's parameters at the step buffer instead (a factory
        that ignored its argument, or an Optimizer instance), carrying any state it already has."""
        to_step = {id(p): s for p, s in zip(self._param_list, self._step_params, strict=True)}
        owned = {id(s) for s in self._step_params}
        for group in optimizer.param_groups:
            steered = []
            for p in group["params"]:
                if id(p) in owned:
                    steered.append(p)
                elif id(p) in to_step:
                    shadow = to_step[id(p)]
                    if p in optimizer.state:
                        optimizer.state[shadow] = optimizer.state.pop(p)
                    steered.append(shadow)
                else:
                    raise ConfigError(
                        "optimizer: expected it to hold only the module's trainable parameters, got a "
                        f"tensor of shape {tuple(p.shape)} that is not one of them; build it with a "
                        "factory, optimizer=lambda params: torch.optim.Adam(params, lr=1e-3)"
                    )
            group["params"] = steered
        return optimizer

    # --- the flat vectors -------------------------------------------------------------------------

    @property
    def params(self) -> np.ndarray:
        """The live flat float32 parameter vector (the module computes with this very memory)."""
        return self._params_np

    @property
    def num_params(self) -> int:
        return int(self._params_np.size)

    @property
    def gradients(self) -> np.ndarray:
        return self._flat_grad.numpy()

    def set_params(self, params: np.ndarray) -> None:
        self._params_np[...] = _flat(params, self.num_params, "params")

    def apply_update(self, update: np.ndarray) -> None:
        self._params_np += _flat(update, self.num_params, "update")

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
        torch = _torch()
        parts = []
        for _, _, value in self._state_slots():
            if isinstance(value, torch.Tensor):
                parts.append(value.detach().reshape(-1).to(torch.float32).numpy())
            elif isinstance(value, int | float):
                parts.append(np.array([value], dtype=np.float32))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def set_updater_state(self, state: np.ndarray) -> None:
        torch = _torch()
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

    def _prepare(self, features: Any, labels: Any, mask: Any):
        x = _inputs.prepare_features(features, self.input_shape, self.dtype)
        y = _inputs.prepare_labels(labels, x.shape[0], self.num_outputs, self.dtype, False, True)
        m = _inputs.prepare_mask(mask, x.shape[0], self.num_outputs, self.dtype)
        return x, y, m

    def _loss(self, out: Any, y: np.ndarray, mask: np.ndarray | None) -> Any:
        torch = _torch()
        target = torch.from_numpy(y)
        if self.targets == "index":
            target = target.argmax(dim=1)
        if mask is None:
            return self.loss_fn(out, target)
        reduction = getattr(self.loss_fn, "reduction", None)
        if reduction is None:
            raise ConfigError("masks need a torch loss module with a 'reduction' attribute")
        self.loss_fn.reduction = "none"
        try:
            per = self.loss_fn(out, target)
        finally:
            self.loss_fn.reduction = reduction
        weights = torch.from_numpy(mask)
        if per.ndim == 1 and weights.ndim == 2:
            raise InvalidInputError("mask: this loss gives one value per example; expected shape (n,)")
        if per.ndim == 2 and weights.ndim == 1:
            weights = weights[:, None]
        return (per * weights).sum() / per.numel()

    def _restore_grad_views(self) -> None:
        for i, p in enumerate(self._param_list):
            if p.grad is None or p.grad.data_ptr() != self._grad_ptrs[i]:
                offset = sum(q.numel() for q in self._param_list[:i])
                slot = self._flat_grad[offset : offset + p.numel()].view_as(p)
                if p.grad is not None:
                    slot.copy_(p.grad)
                p.grad = slot
            if self._step_params[i].grad is not p.grad:
                self._step_params[i].grad = p.grad

    def _gradient(self, x: np.ndarray, y: np.ndarray, mask: np.ndarray | None) -> float:
        torch = _torch()
        self._flat_grad.zero_()
        self.module.train()
        loss = self._loss(self.module(torch.from_numpy(x)), y, mask)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise NonFiniteLossError(f"loss is {value} at iteration {self._iteration}: training diverged")
        loss.backward()
        self._restore_grad_views()
        return value

    def compute_gradient(self, features: Any, labels: Any, mask: Any = None) -> tuple[np.ndarray, float]:
        x, y, m = self._prepare(features, labels, mask)
        loss = self._gradient(x, y, m)
        return self._flat_grad.numpy().copy(), loss

    def compute_update(self, features: Any, labels: Any, mask: Any = None) -> tuple[np.ndarray, float]:
        """Forward, backward, optimizer.step(); returns (step to ADD, loss). Never writes ``params``.

        The optimizer steps the step buffer, loaded first with one read of the live parameters (which
        the node's I/O thread may be changing: the step is then taken from a slightly older point, as
        in any asynchronous SGD, but every update decoded meanwhile stays in ``params``).
        """
        torch = _torch()
        x, y, m = self._prepare(features, labels, mask)
        loss = self._gradient(x, y, m)
        with torch.no_grad():
            base = self._flat.clone()
            self._step_flat.copy_(base)
        self.optimizer.step()
        with torch.no_grad():
            update = self._step_flat - base
        self._iteration += 1
        self.last_loss = loss
        return update.numpy(), loss

    def fit(self, data: Any, epochs: int = 1, batch_size: int = 32, shuffle: bool = True) -> None:
        _inputs.fit_epochs(self, data, epochs, batch_size, shuffle)

    # --- inference --------------------------------------------------------------------------------

    def _raw_output(self, x: np.ndarray) -> Any:
        torch = _torch()
        self.module.eval()
        try:
            with torch.no_grad():
                return self.module(torch.from_numpy(x))
        finally:
            self.module.train()

    def output(self, features: Any) -> np.ndarray:
        torch = _torch()
        out = self._raw_output(_inputs.prepare_features(features, self.input_shape, self.dtype))
        if self.output_activation == "softmax":
            out = torch.softmax(out, dim=1)
        elif self.output_activation == "sigmoid":
            out = torch.sigmoid(out)
        return out.numpy()

    def predict(self, features: Any) -> np.ndarray:
        out = self.output(features)
        if out.shape[1] == 1 and self.output_activation == "sigmoid":
            return (out[:, 0] >= 0.5).astype(np.int64)
        return out.argmax(axis=1)

    def score(self, data: Any, batch_size: int = 4096) -> float:
        total, count = 0.0, 0
        for features, labels, mask in _inputs.minibatches(data, batch_size, None):
            x, y, m = self._prepare(features, labels, mask)
            total += float(self._loss(self._raw_output(x), y, m)) * x.shape[0]
            count += x.shape[0]
        if count == 0:
            raise InvalidInputError("score: expected at least one example, got none")
        return total / count

    def evaluate(self, data: Any, evaluation: Any = None, batch_size: int = 4096) -> Any:
        evaluation = evaluation if evaluation is not None else Evaluation(num_classes=self.num_outputs)
        for features, labels, mask in _inputs.minibatches(data, batch_size, None):
            x, y, m = self._prepare(features, labels, mask)
            evaluation.eval(y, self.output(x), mask=m)
        return evaluation

    # --- copies and files ---------------------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        """Descriptive only (an nn.Module is code, not data): use to_bytes/from_bytes to ship one."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "module": repr(self.module),
            "loss": repr(self.loss_fn),
            "optimizer": type(self.optimizer).__name__,
            "input_shape": list(self.input_shape),
            "output_activation": self.output_activation,
            "targets": self.targets,
        }

    def to_bytes(self, pickle_module: Any = None) -> bytes:
        """The file form. ``pickle_module`` (e.g. cloudpickle) lets code defined in ``__main__`` or a
        notebook travel by value (what psrv.spark does to ship a network to its executors)."""
        torch = _torch()
        payload = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
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
            "normalizer": self.normalizer.get_state() if self.normalizer is not None else None,
        }
        buffer = io.BytesIO()
        if pickle_module is None:
            torch.save(payload, buffer)
        else:
            torch.save(payload, buffer, pickle_module=pickle_module, pickle_protocol=4)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, source: str = "buffer") -> TorchNetwork:
        torch = _torch()
        try:
            payload = torch.load(io.BytesIO(bytes(data)), weights_only=False)
        except Exception as exc:
            raise ModelFileError(f"{source}: not a readable TorchNetwork file: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ModelFileError(f"{source}: not a TorchNetwork file (expected format {FORMAT!r})")
        if payload.get("format_version", 0) > FORMAT_VERSION:
            raise ModelFileError(f"{source}: TorchNetwork format {payload['format_version']} is too new")
        optimizer_class, defaults = payload["optimizer_class"], payload["optimizer_defaults"]
        net = cls(
            payload["module"], payload["loss"], payload["input_shape"],
            optimizer=lambda ps: optimizer_class(ps, **defaults),
            output_activation=payload["output_activation"], targets=payload["targets"],
        )
        net.optimizer.load_state_dict(payload["optimizer_state"])
        net._iteration, net._epoch = payload["iteration"], payload["epoch"]
        if payload.get("normalizer") is not None:
            net.normalizer = normalizer_from_state(payload["normalizer"])
        return net

    def save(self, path: Any) -> None:
        write_atomically(path, self.to_bytes())

    @classmethod
    def load(cls, path: Any) -> TorchNetwork:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise ModelFileError(f"cannot read TorchNetwork file {path!r}: {exc}") from exc
        return cls.from_bytes(data, source=str(path))

    def clone(self) -> TorchNetwork:
        return TorchNetwork.from_bytes(self.to_bytes())

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # pickling goes through the file form, so the copy re-binds its own flat buffer
        return (TorchNetwork.from_bytes, (self.to_bytes(),))


def _flat(vec: Any, size: int, what: str) -> np.ndarray:
    arr = np.asarray(vec)
    if arr.shape != (size,):
        raise InvalidInputError(f"{what}: expected a flat vector of shape ({size},), got shape {arr.shape}")
    return arr


__all__ = ["TorchNetwork"]
