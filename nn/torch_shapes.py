"""Outputs of any shape for ``TorchNetwork``: labels, masks, loss, activation and evaluation rows.

A module's output is any tensor with the batch first; its per-example shape ``S`` decides where the
classes are (the *class axis*, an axis of the batch tensor):

- ``(n,)``: no class axis (a scalar head: regression, or one sigmoid probability);
- ``(n, k)``: axis 1;
- ``(n, T, k)``: a sequence, classes LAST (axis 2), as a ``batch_first`` RNN and the sequence pipeline
  give them. torch's losses want classes on axis 1 (``CrossEntropyLoss`` takes ``(n, k, T)``), so the
  network moves the class axis to 1 (output, labels and an elementwise mask alike) before calling the
  loss: a user writes ``nn.CrossEntropyLoss()`` and a module returning ``(n, T, k)``;
- ``(n, C, H, W)`` and any other 4+ dimensional output: axis 1 (channels first, torch's convention for
  segmentation; ``CrossEntropyLoss`` takes it as it is).

Labels are the output's shape, or integer class indices with the class axis removed (``(n, T)`` for a
tagger, ``(n, H, W)`` for a segmentation map), which become one-hot along the class axis. A labels mask is
per example ``(n,)``, per position (the output's shape without the class axis: ``(n, T)``, ``(n, H, W)``)
or per element (the output's shape); masked elements contribute nothing and the loss is the mean over the
unmasked ones (weights: the weighted mean).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from psrv.nn import _inputs, eval_common
from psrv.nn.errors import ConfigError, InvalidInputError


def class_axis(shape: tuple[int, ...]) -> int | None:
    """The class axis of an output of per-example ``shape`` (an axis of the batch tensor), or None."""
    if not shape:
        return None
    return 2 if len(shape) == 2 else 1


def probe_shape(out: Any, index: int, multi: bool) -> tuple[int, ...]:
    """The per-example shape of one output of the probe batch (a tensor with the batch first)."""
    shape = tuple(getattr(out, "shape", ()))
    if len(shape) < 1:
        name = f"the module's output {index}" if multi else "the module"
        got = "a 0-dimensional tensor" if hasattr(out, "shape") else type(out).__name__
        raise ConfigError(f"{name} must output a tensor with the batch first ((n,), (n, k), (n, T, k), "
                          f"(n, C, H, W) ...), got {got}")
    return tuple(int(d) for d in shape[1:])


def positions(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The per-example shape without the class axis (what class-index labels and step masks have)."""
    axis = class_axis(shape)
    return shape if axis is None else shape[: axis - 1] + shape[axis:]


def _describe(n: Any, shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(d) for d in (n, *shape)) + ")"


def _fits(got: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(got) == len(expected) and all(e is None or g == e for g, e in zip(got, expected, strict=True))


def prepare_labels(labels: Any, n: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Labels of an output of per-example ``shape``, as (n, *shape) float rows of the network's dtype."""
    if len(shape) == 1:  # (n, k): one-hot rows or class indices (n,), as always
        return _inputs.prepare_labels(labels, n, shape[0], dtype, False, True)
    y = _inputs.as_array(labels, "labels")
    axis = class_axis(shape)
    if y.shape == (n, *shape) or (not shape and y.shape == (n, 1)):
        y = np.ascontiguousarray(y.reshape((n, *shape)), dtype=dtype)
        _inputs.check_finite(y, "labels")
        return y
    if axis is not None and y.dtype.kind in "iub" and y.shape == (n, *positions(shape)):
        k = shape[axis - 1]
        if y.size and (y.min() < 0 or y.max() >= k):
            raise InvalidInputError(f"labels: expected class indices in [0, {k - 1}], got values in "
                                    f"[{y.min()}, {y.max()}]")
        one_hot = np.eye(k, dtype=dtype)[y]  # classes last
        return np.ascontiguousarray(np.moveaxis(one_hot, -1, axis))
    if len(shape) > 1 and y.shape == (n, int(np.prod(shape))):  # array columns come flat
        return prepare_labels(y.reshape((n, *shape)), n, shape, dtype)
    hint = "" if axis is None else f" or integer class indices of shape {_describe(n, positions(shape))}"
    raise InvalidInputError(f"labels: expected shape {_describe(n, shape)} (the module's output){hint}, "
                            f"got shape {y.shape}")


def prepare_mask(mask: Any, n: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """A labels mask: None, per example (n,) / (n, 1), per position (n, *positions) or per element."""
    if mask is None:
        return None
    if len(shape) == 1:
        return _inputs.prepare_mask(mask, n, shape[0], dtype)
    m = _inputs.as_array(mask, "mask")
    if m.shape in ((n,), (n, 1)):
        m = m.reshape(n)
    elif m.shape not in ((n, *positions(shape)), (n, *shape)):
        raise InvalidInputError(f"mask: expected shape ({n},) per example, {_describe(n, positions(shape))} "
                                f"per position or {_describe(n, shape)} per element, got shape {m.shape}")
    m = np.ascontiguousarray(m, dtype=dtype)
    _inputs.check_finite(m, "mask")
    if m.size and m.min() < 0:
        raise InvalidInputError(f"mask: expected values >= 0, got minimum {m.min()}")
    return m


def prepare_features_mask(mask: Any, n: int, dtype: np.dtype) -> np.ndarray | None:
    """A features mask (one per example, step or pixel: any shape with the batch first)."""
    if mask is None:
        return None
    m = _inputs.as_array(mask, "features_mask")
    if m.ndim < 1 or m.shape[0] != n:
        raise InvalidInputError(f"features_mask: expected {n} rows (one per example), got shape {m.shape}")
    m = np.ascontiguousarray(m, dtype=dtype)
    _inputs.check_finite(m, "features_mask")
    return m


def takes_mask(module: Any) -> bool:
    """Whether the module's ``forward`` has a ``mask`` parameter (it then receives the features mask)."""
    try:
        return "mask" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def loss_view(out: Any, target: Any, axis: int | None) -> tuple[Any, Any]:
    """Output and labels with the class axis on 1, where torch's losses want it."""
    if axis is not None and axis != 1:
        return out.movedim(axis, 1), target.movedim(axis, 1)
    return out, target


def masked_loss(loss_fn: Any, form: str, out: Any, target: Any, weights: Any, axis: int | None) -> Any:
    """One output's loss; a mask makes it the mean over unmasked elements (reduction "none" for the call;
    masked elements' losses are replaced by zero before weighting, so whatever they are, nothing of them
    reaches the loss or the gradients through it)."""
    torch = _torch()
    out_view, target_view = loss_view(out, target, axis)
    if form == "index":
        target_view = target_view.argmax(dim=1)
    if weights is None:
        return loss_fn(out_view, target_view)
    reduction = getattr(loss_fn, "reduction", None)
    if reduction is None:
        raise ConfigError("masks need a torch loss module with a 'reduction' attribute")
    loss_fn.reduction = "none"
    try:
        per = loss_fn(out_view, target_view)
    finally:
        loss_fn.reduction = reduction
    w = _weights_for(weights, per, out_view, axis).expand_as(per)
    kept = torch.where(w != 0, per, torch.zeros_like(per))
    total = w.sum()
    return (kept * w).sum() / torch.where(total > 0, total, torch.ones_like(total))


def _weights_for(weights: Any, per: Any, out_view: Any, axis: int | None) -> Any:
    """The mask shaped to broadcast over the loss's per-element values."""
    if weights.ndim == out_view.ndim and weights.ndim > 1:  # per element: moved like the output
        weights = weights.movedim(axis, 1) if axis is not None and axis != 1 else weights
    elif weights.ndim == 1:
        weights = weights.reshape((-1,) + (1,) * (per.ndim - 1))
    elif per.ndim == out_view.ndim:  # per position, an elementwise loss: broadcast over the classes
        weights = weights.unsqueeze(1)
    pairs = zip(weights.shape, per.shape, strict=False)
    fits = weights.ndim == per.ndim and all(w in (1, p) for w, p in pairs)
    if not fits:
        raise InvalidInputError(f"mask: this loss gives per-element values of shape {tuple(per.shape)}; "
                                f"a mask of shape {tuple(weights.shape)} does not fit them (a class-reducing "
                                "loss such as CrossEntropyLoss takes a per-example or per-position mask)")
    return weights


def activate(out: Any, activation: str | None, axis: int | None) -> Any:
    torch = _torch()
    if activation == "softmax":
        return torch.softmax(out, dim=axis)
    if activation == "sigmoid":
        return torch.sigmoid(out)
    return out


def check_activation(activation: str | None, shape: tuple[int, ...], where: str) -> None:
    if activation == "softmax" and class_axis(shape) is None:
        raise ConfigError(f"output_activation{where}='softmax' needs a class axis, but the module outputs "
                          "(n,) (one value per example): use output_activation=None for regression or "
                          "'sigmoid' for one probability")


def masked_steps_zeroed(output: np.ndarray, features_mask: np.ndarray | None) -> np.ndarray:
    """A sequence output (n, T, k) with its masked steps set to zero (what inference returns for the
    padding); other outputs as they are."""
    if features_mask is None or output.ndim != 3 or features_mask.shape != output.shape[:2]:
        return output
    return output * (features_mask != 0)[:, :, None].astype(output.dtype)


def evaluation_rows(labels: np.ndarray, output: np.ndarray, mask: np.ndarray | None,
                    axis: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(labels, predictions, mask) as the evaluations take them: one row per example (n, k), or for an
    output with positions (sequence steps, pixels) one row per position with the classes last, the
    positions a mask removes dropped (``eval_common.flatten_positions`` does the flattening, as for the
    evaluations' own time series). (n,) outputs become one column."""
    if output.ndim == 2:
        return labels, output, mask
    if axis is not None:  # classes last, then every axis before them is a position
        labels, output = np.moveaxis(labels, axis, -1), np.moveaxis(output, axis, -1)
        if mask is not None and mask.ndim == output.ndim:
            mask = np.moveaxis(mask, axis, -1)
    lead = output.ndim if axis is None else output.ndim - 1
    if mask is not None and mask.ndim == 1 and lead > 1:  # per example: every position of the example
        mask = np.broadcast_to(mask.reshape((-1,) + (1,) * (lead - 1)), output.shape[:lead])
    rows_y, rows_p, rows_m = eval_common.flatten_positions(labels, output, mask, lead=lead)
    if axis is None:
        return rows_y.reshape(-1, 1), rows_p.reshape(-1, 1), None
    return rows_y, rows_p, rows_m


def predictions(output: np.ndarray, activation: str | None, axis: int | None) -> np.ndarray:
    """Class indices of an output (the class axis removed); a single sigmoid value or column is
    thresholded at 0.5; a regression output without classes is returned as it is."""
    if axis is None:
        return (output >= 0.5).astype(np.int64) if activation == "sigmoid" else output
    if output.shape[axis] == 1 and activation == "sigmoid":
        return (np.take(output, 0, axis=axis) >= 0.5).astype(np.int64)
    return output.argmax(axis=axis)


def shape_fits(got: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    """Whether a per-example shape fits an expected one (None: any length, e.g. a sequence's steps)."""
    return _fits(tuple(got), tuple(expected))


def labels_fit(shape: tuple[int, ...], labels: tuple[int, ...], varying: bool) -> bool:
    """Whether labels of per-example shape ``labels`` can be an output's of per-example ``shape``: the
    same shape, class indices without the class axis, or the same values flat; with ``varying`` (the
    input's length varies) a sequence output's steps may be any length."""
    steps = varying and len(shape) == 2
    candidates: list[tuple[int | None, ...]] = [(None, shape[1]), (None,)] if steps else \
        [shape, positions(shape)]
    if not shape:
        candidates.append((1,))
    flat = not steps and int(np.prod(labels)) == int(np.prod(shape))
    return flat or any(shape_fits(labels, c) for c in candidates)


def _torch() -> Any:
    import torch

    return torch


__all__ = ["activate", "check_activation", "class_axis", "evaluation_rows", "labels_fit", "masked_loss",
           "masked_steps_zeroed", "positions", "predictions", "prepare_features_mask", "prepare_labels",
           "prepare_mask", "probe_shape", "shape_fits", "takes_mask"]
