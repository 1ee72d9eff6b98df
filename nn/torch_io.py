"""Several inputs and several outputs for ``TorchNetwork`` (DL4J's ComputationGraph on a MultiDataSet).

A module's ``forward`` may take several tensors and return one tensor or a tuple/list of tensors:

- ``input_shape`` is then a list of shapes, one per input (``[(8,), (3, 4)]``), and features are a list
  of arrays in the same order (a ``MultiDataSet``'s ``features``); a list of ints stays ONE shape.
- every output is a tensor with the batch first (any shape: psrv.nn.torch_shapes) with its own loss
  (one loss object for all, or a sequence), its own ``output_activation`` and ``targets`` (one value
  for all, or a sequence), its own labels (a ``MultiDataSet``'s ``labels[i]``) and labels mask. The training
  loss is the SUM of the outputs' losses (weight an output inside its loss to change that).
- evaluation is PER OUTPUT: ``TorchNetwork.evaluate`` of a network of several outputs returns a
  :class:`PerOutput` (a list, one evaluation per output); a single evaluation object given to it
  evaluates the first output only.

A single-input, single-output module keeps exactly the one-array forms (``Layout.multi_input`` and
``Layout.multi_output`` are False): nothing here changes what such a network computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from psrv.nn import _inputs, torch_shapes
from psrv.nn.errors import ConfigError, InvalidInputError
from psrv.nn.evaluation import Evaluation, RegressionEvaluation

OUTPUT_ACTIVATIONS = (None, "softmax", "sigmoid")
TARGETS = ("onehot", "index")


def input_shapes(input_shape: Any) -> tuple[tuple[tuple[int, ...], ...], bool]:
    """(one shape per input, several inputs?) of ``input_shape``: an int or a sequence of ints is ONE
    shape; a sequence whose items are sequences is one shape per input of ``forward``."""
    if isinstance(input_shape, int | np.integer):
        return ((int(input_shape),),), False
    if not isinstance(input_shape, Sequence) or isinstance(input_shape, str | bytes):
        raise ConfigError(f"input_shape: expected a shape like (64,) or a list of shapes like [(8,), (4,)], "
                          f"got {input_shape!r}")
    items = list(input_shape)
    if items and all((s is None or isinstance(s, Sequence | int | np.integer)) and not isinstance(s, str)
                     for s in items) \
            and any(isinstance(s, Sequence) for s in items):
        shapes = tuple(_one_shape(s, f"input_shape[{i}]") for i, s in enumerate(items))
        return shapes, True
    return (_one_shape(items, "input_shape"),), False


def _one_shape(shape: Any, what: str) -> tuple[Any, ...]:
    """Positive ints; None where any length goes (a sequence's steps, ``(None, f)``)."""
    dims = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if not dims or not all(d is None or (isinstance(d, int | np.integer) and d > 0) for d in dims):
        raise ConfigError(f"{what}: expected positive ints like (64,) or (1, 28, 28) (None for a length "
                          f"that varies, e.g. a sequence's steps (None, 8)), got {shape!r}")
    return tuple(None if d is None else int(d) for d in dims)


def per_output(value: Any, count: int, what: str) -> list[Any]:
    """One value for every output, or a list/tuple of exactly ``count`` values (one per output)."""
    if isinstance(value, list | tuple):
        if len(value) != count:
            raise ConfigError(f"{what}: the module has {count} outputs, got a sequence of {len(value)} "
                              f"(give one value for all outputs or one per output)")
        return list(value)
    return [value] * count


def output_shapes(probe: Any) -> tuple[tuple[tuple[int, ...], ...], bool]:
    """(per-example shape of each output, several outputs?) of what the module returned on a probe
    batch. A length that varies with the input (a sequence's steps) is whatever the probe gave: only the
    number of dimensions and the class axis's size are kept as facts."""
    multi = isinstance(probe, list | tuple)
    outs = list(probe) if multi else [probe]
    if not outs:
        raise ConfigError("the module returned an empty tuple: expected a tensor or a tuple of tensors")
    return tuple(torch_shapes.probe_shape(out, i, multi) for i, out in enumerate(outs)), multi


def probe_input(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """The probe batch's per-example shape: a varying length (None) probes with 2 steps."""
    return tuple(2 if d is None else d for d in shape)


@dataclass(frozen=True)
class Layout:
    """What a TorchNetwork's module takes and gives, and per output its loss, activation, target form."""

    input_shapes: tuple[tuple[Any, ...], ...]
    multi_input: bool
    output_sizes: tuple[int, ...]  # per output: the size of its class axis (1 for an (n,) output)
    multi_output: bool
    losses: tuple[Any, ...]
    activations: tuple[str | None, ...]
    targets: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...] = ()  # per output: its per-example shape on the probe
    takes_mask: bool = False  # forward(..., mask=...) receives the features mask

    @property
    def class_axes(self) -> tuple[int | None, ...]:
        return tuple(torch_shapes.class_axis(shape) for shape in self.output_shapes)

    @classmethod
    def build(cls, shapes: tuple[tuple[Any, ...], ...], multi_input: bool, probe: Any, loss: Any,
              output_activation: Any, targets: Any, module: Any = None) -> Layout:
        out_shapes, multi_output = output_shapes(probe)
        count = len(out_shapes)
        losses = per_output(loss, count, "loss")
        activations = per_output(output_activation, count, "output_activation")
        target_forms = per_output(targets, count, "targets")
        for i, (fn, act, form) in enumerate(zip(losses, activations, target_forms, strict=True)):
            where = f"[{i}]" if multi_output else ""
            if not callable(fn):
                raise ConfigError(f"loss{where}: expected a torch loss (callable), got {type(fn).__name__}")
            if act not in OUTPUT_ACTIVATIONS:
                raise ConfigError(f"output_activation{where} must be one of {OUTPUT_ACTIVATIONS}, "
                                  f"got {act!r}")
            if form not in TARGETS:
                raise ConfigError(f"targets{where} must be 'onehot' or 'index', got {form!r}")
            torch_shapes.check_activation(act, out_shapes[i], where)
            if form == "index" and torch_shapes.class_axis(out_shapes[i]) is None:
                raise ConfigError(f"targets{where}='index' needs a class axis, but the module outputs (n,)")
        sizes = tuple(1 if not shape else shape[torch_shapes.class_axis(shape) - 1] for shape in out_shapes)
        return cls(shapes, multi_input, sizes, multi_output, tuple(losses), tuple(activations),
                   tuple(target_forms), out_shapes, module is not None and torch_shapes.takes_mask(module))

    def shape_of(self, index: int, n: int, features: list[np.ndarray]) -> tuple[int, ...]:
        """Output ``index``'s per-example shape for a batch: a sequence output's steps follow the
        features' steps (their axis 1) when the input's length varies."""
        shape = self.output_shapes[index]
        varying = any(d is None for d in self.input_shapes[0])
        if varying and len(shape) == 2 and features and features[0].ndim >= 2:
            return (int(features[0].shape[1]), shape[1])
        return shape

    # --- host batches ---------------------------------------------------------------------------------
    def inputs(self, features: Any, dtype: np.dtype) -> list[np.ndarray]:
        """One checked array per input; a bare array is accepted for a module of one input."""
        if not self.multi_input:
            shape = self.input_shapes[0]
            # a MultiDataSet's list of one batch is that batch; a list of example rows stays a batch
            if isinstance(features, list | tuple) and features and all(_is_batch(f, shape) for f in features):
                if len(features) == 1:
                    features = features[0]
                else:
                    raise InvalidInputError(
                        f"features: the module takes one input of shape {self.input_shapes[0]}, got a list "
                        f"of {len(features)} arrays (a MultiDataSet of several inputs): give the module's "
                        "forward one parameter per input and input_shape one shape per input")
            return [_inputs.prepare_features(features, self.input_shapes[0], dtype)]
        arrays = _listed(features, len(self.input_shapes), "features", "input")
        out = []
        for i, (array, shape) in enumerate(zip(arrays, self.input_shapes, strict=True)):
            try:
                out.append(_inputs.prepare_features(array, shape, dtype))
            except InvalidInputError as exc:
                raise InvalidInputError(f"features[{i}] (input_shape[{i}]={shape}): {exc}") from exc
        counts = {x.shape[0] for x in out}
        if len(counts) > 1:
            raise InvalidInputError(f"features: expected the same number of examples in every input, got "
                                    f"{[x.shape[0] for x in out]}")
        return out

    def labels(self, labels: Any, n: int, dtype: np.dtype,
               features: list[np.ndarray] | None = None) -> list[np.ndarray]:
        count = len(self.output_sizes)
        arrays = _listed(labels, count, "labels", "output") if self.multi_output else [_single(labels, n)]
        out = []
        for i, array in enumerate(arrays):
            shape = self.shape_of(i, n, features or [])
            try:
                out.append(torch_shapes.prepare_labels(array, n, shape, dtype))
            except InvalidInputError as exc:
                if not self.multi_output:
                    raise
                has = f"{shape[0]} columns" if len(shape) == 1 else f"shape {('n', *shape)}"
                raise InvalidInputError(f"labels[{i}] (output {i} has {has}): {exc}") from exc
        return out

    def masks(self, mask: Any, n: int, dtype: np.dtype,
              features: list[np.ndarray] | None = None) -> list[np.ndarray | None]:
        if not self.multi_output:
            shape = self.shape_of(0, n, features or [])
            return [torch_shapes.prepare_mask(_single(mask, n), n, shape, dtype)]
        if mask is None:
            return [None] * len(self.output_sizes)
        masks = _listed(mask, len(self.output_sizes), "labels masks", "output")
        return [torch_shapes.prepare_mask(m, n, self.shape_of(i, n, features or []), dtype)
                for i, m in enumerate(masks)]

    def features_mask(self, mask: Any, n: int, dtype: np.dtype) -> Any:
        """The features mask as the module's ``mask`` keyword takes it (None when the module has no
        ``mask`` parameter: it is then not needed, e.g. a left-to-right tagger whose padding comes
        after the real steps); a list, one per input, for a module of several inputs."""
        if mask is None or not self.takes_mask:
            return None
        if self.multi_input and isinstance(mask, list | tuple):
            return [torch_shapes.prepare_features_mask(m, n, dtype) for m in mask]
        return torch_shapes.prepare_features_mask(mask, n, dtype)

    def forward(self, module: Any, tensors: list[Any], mask: Any) -> Any:
        """The module called on one batch, with ``mask=`` when it takes one and there is a mask."""
        if mask is None:
            return module(*tensors)
        return module(*tensors, mask=mask)

    # --- tensors ----------------------------------------------------------------------------------------
    def outputs(self, raw: Any) -> list[Any]:
        """The module's result as a list of (n, k_i) tensors, checked against the layout."""
        outs = list(raw) if isinstance(raw, list | tuple) else [raw]
        if len(outs) != len(self.output_sizes):
            raise InvalidInputError(f"the module returned {len(outs)} outputs, expected "
                                    f"{len(self.output_sizes)} "
                                    "(as on the probe batch when the network was built)")
        return outs

    def total_loss(self, outs: list[Any], targets: list[Any], weights: list[Any]) -> Any:
        """The sum over outputs of each output's loss (one output: that loss, as it is)."""
        total = None
        parts = zip(self.losses, self.targets, outs, targets, weights, self.class_axes, strict=True)
        for fn, form, out, target, weight, axis in parts:
            value = torch_shapes.masked_loss(fn, form, out, target, weight, axis)
            total = value if total is None else total + value
        return total

    def activate(self, outs: list[Any]) -> list[Any]:
        return [torch_shapes.activate(out, activation, axis)
                for out, activation, axis in zip(outs, self.activations, self.class_axes, strict=True)]

    def for_evaluation(self, index: int, labels: np.ndarray, output: np.ndarray,
                       mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(labels, predictions, mask) of one output as an evaluation takes them: rows (n, k); an output
        with positions (steps, pixels) gives one row per position, the masked positions dropped
        (torch_shapes.evaluation_rows); a single sigmoid column becomes two classes [1 - p, p] (labels
        likewise), as Network.evaluate does."""
        labels, output, mask = torch_shapes.evaluation_rows(labels, output, mask, self.class_axes[index])
        if self.activations[index] == "sigmoid" and output.shape[1] == 1:
            return np.hstack([1 - labels, labels]), np.hstack([1 - output, output]), mask
        return labels, output, mask

    def default_evaluations(self) -> PerOutput:
        """Per output: classification for a softmax/sigmoid output (a single sigmoid column counts as two
        classes), regression metrics for an output without activation."""
        return PerOutput(self.default_evaluation(i) for i in range(len(self.output_sizes)))

    def default_evaluation(self, index: int) -> Any:
        """Classification for a softmax/sigmoid output, regression metrics otherwise (one output)."""
        if self.activations[index] is None:
            return RegressionEvaluation()
        return Evaluation(num_classes=max(2, self.output_sizes[index]))


def output_loss(loss_fn: Any, targets: str, out: Any, target: Any, weights: Any) -> Any:
    """One (n, k) output's loss (torch_shapes.masked_loss takes any shape)."""
    return torch_shapes.masked_loss(loss_fn, targets, out, target, weights, 1)


class PerOutput(list):
    """One evaluation per output of a network of several outputs: ``eval`` takes lists of labels and
    predictions (and masks), ``merge`` merges output by output, so Spark's distributed evaluation
    merges it as any single evaluation."""

    def eval(self, labels: Sequence[Any], predictions: Sequence[Any], mask: Any = None) -> None:
        masks = [None] * len(self) if mask is None else list(mask)
        if not (len(labels) == len(predictions) == len(masks) == len(self)):
            raise InvalidInputError(f"PerOutput.eval: expected {len(self)} labels, predictions and masks "
                                    "(one "
                                    f"per output), got {len(labels)}, {len(predictions)} and {len(masks)}")
        for evaluation, y, p, m in zip(self, labels, predictions, masks, strict=True):
            evaluation.eval(y, p, mask=m)

    def merge(self, other: PerOutput) -> PerOutput:
        if len(other) != len(self):
            raise InvalidInputError(f"PerOutput.merge: {len(self)} outputs here, {len(other)} there")
        for mine, theirs in zip(self, other, strict=True):
            mine.merge(theirs)
        return self


def evaluate_outputs(network: Any, data: Any, evaluation: Any, batch_size: int) -> Any:
    """TorchNetwork.evaluate. A module of several outputs: a PerOutput (from None: the defaults; from a
    list: one evaluation per output), or one evaluation object filled from the first output only. One
    output: ``evaluation`` or by default classification (regression for an (n,) output without
    activation). Outputs with positions are evaluated one row per position (Layout.for_evaluation)."""
    layout: Layout = network.layout
    first_only = evaluation is not None and not isinstance(evaluation, list | tuple)
    if not layout.multi_output:
        single = layout.class_axes[0] is not None or layout.activations[0] is not None
        evaluation = evaluation if evaluation is not None else \
            Evaluation(num_classes=layout.output_sizes[0]) if single else RegressionEvaluation()
        first_only = True
    if evaluation is None:
        evaluation = layout.default_evaluations()
    elif not first_only and not isinstance(evaluation, PerOutput):
        evaluation = PerOutput(evaluation)
    for features, labels, mask, features_mask in _inputs.masked_minibatches(data, batch_size, None):
        xs, ys, ms = network._prepare(features, labels, mask)
        outs = network._outputs(xs, network.layout.features_mask(features_mask, xs[0].shape[0],
                                                                 network.dtype))
        if first_only:
            y, p, m = (layout.for_evaluation(0, ys[0], outs[0], ms[0]) if layout.multi_output else
                       torch_shapes.evaluation_rows(ys[0], outs[0], ms[0], layout.class_axes[0]))
            evaluation.eval(y, p, mask=m)
            continue
        rows = [layout.for_evaluation(i, *parts) for i, parts in enumerate(zip(ys, outs, ms, strict=True))]
        evaluation.eval([r[0] for r in rows], [r[1] for r in rows], mask=[r[2] for r in rows])
    return evaluation


def _single(value: Any, n: int) -> Any:
    """A 1-in 1-out MultiDataSet's list of one labels array (or mask, or None) is that array; anything
    else (example rows as lists) is left as it is."""
    if isinstance(value, list | tuple) and len(value) == 1:
        item = value[0]
        if item is None or (isinstance(item, np.ndarray) and item.ndim >= 1 and item.shape[0] == n
                            and (item.ndim == 2 or n > 1)):
            return item
    return value


def _is_batch(value: Any, shape: tuple[int, ...]) -> bool:
    """Whether an array is a batch of examples of ``shape``, (n, *shape) or (n, prod(shape))."""
    if not isinstance(value, np.ndarray):
        return False
    flat = len(shape) > 1 and value.ndim == 2 and value.shape[1] == int(np.prod(shape))
    return value.ndim == len(shape) + 1 or flat


def _listed(value: Any, count: int, what: str, item: str) -> list[Any]:
    if isinstance(value, np.ndarray) and count == 1:
        return [value]
    if not isinstance(value, list | tuple):
        raise InvalidInputError(f"{what}: the module has {count} {item}s, expected a list of {count} arrays "
                                f"(a MultiDataSet's), got {type(value).__name__}")
    if len(value) != count:
        raise InvalidInputError(f"{what}: the module has {count} {item}s, got {len(value)} arrays")
    return list(value)


def _torch() -> Any:
    import torch

    return torch


__all__ = ["Layout", "PerOutput", "evaluate_outputs", "input_shapes", "output_loss", "per_output"]
