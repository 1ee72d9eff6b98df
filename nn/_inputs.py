"""Validation of what callers hand a network: features, labels, masks and data sets.

Every check runs before anything is computed, so a bad batch leaves parameters and updater state as
they were, and every message names what was expected and what came.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from psrv.nn.errors import InvalidInputError


def _as_array(value: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what}: expected a numeric array, got {type(value).__name__}") from exc
    if arr.dtype.kind not in "fiub":
        raise InvalidInputError(f"{what}: expected a numeric array, got dtype {arr.dtype}")
    return arr


def _check_finite(arr: np.ndarray, what: str) -> None:
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = ~np.isfinite(arr)
        first = np.argwhere(bad)[0]
        raise InvalidInputError(
            f"{what}: expected finite values, got {int(bad.sum())} NaN/inf"
            f" (first at index {tuple(first.tolist())})"
        )


def prepare_features(features: Any, input_shape: tuple[int | None, ...], dtype: np.dtype) -> np.ndarray:
    """(n, *input_shape) array of the network's dtype; (n, prod(input_shape)) is reshaped for images.
    A None in ``input_shape`` takes any length there (a sequence's steps: ``(None, f)``)."""
    if isinstance(features, list) and len(features) > 1 and all(
            isinstance(f, np.ndarray) and f.ndim == len(input_shape) + 1 for f in features):
        raise InvalidInputError(
            f"features: expected one batch of shape (n, {', '.join(map(str, input_shape))}), got a list of "
            f"{len(features)} batches (a MultiDataSet of several inputs): this network takes one input "
            "(psrv.nn.Network is sequential); use a TorchNetwork with input_shape=[shape, shape, ...]")
    x = _as_array(features, "features")
    variable = any(d is None for d in input_shape)
    flat = 0 if variable else int(np.prod(input_shape))
    expected = f"(n, {', '.join(map(str, input_shape))})"
    if len(input_shape) > 1 and not variable:
        expected += f" or (n, {flat})"
    if x.ndim == 0 or x.shape[0] == 0:
        raise InvalidInputError(
            f"features: expected a non-empty batch of shape {expected}, got shape {x.shape}"
        )
    if x.shape[1:] != tuple(input_shape):
        if variable and x.ndim == len(input_shape) + 1 and all(
                d is None or g == d for g, d in zip(x.shape[1:], input_shape, strict=True)):
            pass
        elif x.ndim == 2 and x.shape[1] == flat and not variable:
            x = x.reshape((x.shape[0], *input_shape))
        else:
            raise InvalidInputError(f"features: expected shape {expected}, got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=dtype)
    _check_finite(x, "features")
    return x


def prepare_labels(
    labels: Any, n: int, n_out: int, dtype: np.dtype, probability_labels: bool, class_indices_ok: bool
) -> np.ndarray:
    """(n, n_out) labels; integer class indices (n,) become one-hot when the loss is multi-class."""
    y = _as_array(labels, "labels")
    if y.ndim == 1 and class_indices_ok and y.dtype.kind in "iub":
        if y.shape[0] != n:
            raise InvalidInputError(
                f"labels: expected {n} class indices (one per example), got shape {y.shape}"
            )
        if y.size and (y.min() < 0 or y.max() >= n_out):
            raise InvalidInputError(
                f"labels: expected class indices in [0, {n_out - 1}], got values in [{y.min()}, {y.max()}]"
            )
        one_hot = np.zeros((n, n_out), dtype=dtype)
        one_hot[np.arange(n), y] = 1
        return one_hot
    if y.ndim == 1 and n_out == 1:
        y = y.reshape(-1, 1)
    if y.shape != (n, n_out):
        hint = " or class indices of shape (n,)" if class_indices_ok else ""
        raise InvalidInputError(f"labels: expected shape ({n}, {n_out}){hint}, got shape {y.shape}")
    y = np.ascontiguousarray(y, dtype=dtype)
    _check_finite(y, "labels")
    if probability_labels and y.size and (y.min() < 0 or y.max() > 1):
        raise InvalidInputError(
            f"labels: expected values in [0, 1] for this loss, got values in [{y.min()}, {y.max()}]"
        )
    return y


def prepare_mask(mask: Any, n: int, n_out: int, dtype: np.dtype) -> np.ndarray | None:
    """None, a per-example mask (n,) / (n, 1), or a per-output mask (n, n_out); values >= 0."""
    if mask is None:
        return None
    m = _as_array(mask, "mask")
    if m.shape in ((n,), (n, 1)):
        m = m.reshape(n)
    elif m.shape != (n, n_out):
        raise InvalidInputError(
            f"mask: expected shape ({n},), ({n}, 1) or ({n}, {n_out}), got shape {m.shape}"
        )
    m = np.ascontiguousarray(m, dtype=dtype)
    _check_finite(m, "mask")
    if m.size and m.min() < 0:
        raise InvalidInputError(f"mask: expected values >= 0, got minimum {m.min()}")
    return m


as_array = _as_array
check_finite = _check_finite


def features_mask_of(item: Any) -> Any:
    """The features mask of a DataSet (a MultiDataSet's list of them; None when it has none)."""
    masks = getattr(item, "features_masks", None)
    if masks is not None:
        return None if all(m is None for m in masks) else (masks[0] if len(masks) == 1 else list(masks))
    return getattr(item, "features_mask", None)


def takes_keyword(function: Any, name: str) -> bool:
    """Whether ``function`` (a network's step, a partial of one) takes the keyword ``name``; False where
    its signature cannot be read."""
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def takes_local_steps(network: Any) -> bool:
    """Whether every step a Spark task may take of this network takes ``local_steps`` (a ``TorchNetwork``'s
    ``compute_update``, ``_tensor`` and ``_pair``; a subclass that overrides one keeps its own)."""
    return all(takes_keyword(getattr(network, name, None), "local_steps")
               for name in ("compute_update", "compute_update_tensor", "compute_update_pair"))


def step_arguments(compute: Any, features_mask: Any) -> dict[str, Any]:
    """``features_mask=`` for a network's compute_update when there is one and the network takes it (a
    feed-forward psrv.nn.Network does not: it has no use for a features mask)."""
    if features_mask is None or not takes_keyword(compute, "features_mask"):
        return {}
    return {"features_mask": features_mask}


def unpack(item: Any) -> tuple[Any, Any, Any]:
    """(features, labels, labels_mask) of a DataSet-like object or a (features, labels[, mask]) tuple."""
    if hasattr(item, "features") and hasattr(item, "labels"):
        return item.features, item.labels, getattr(item, "labels_mask", None)
    if isinstance(item, tuple) and len(item) in (2, 3):
        return item[0], item[1], item[2] if len(item) == 3 else None
    raise InvalidInputError(
        "expected a DataSet (with .features and .labels) or a (features, labels) tuple,"
        f" got {type(item).__name__}"
    )


def is_single(data: Any) -> bool:
    return (hasattr(data, "features") and hasattr(data, "labels")) or (
        isinstance(data, tuple) and len(data) in (2, 3) and isinstance(data[0], np.ndarray)
    )


def minibatches(
    data: Any, batch_size: int, rng: np.random.Generator | None
) -> Iterator[tuple[Any, Any, Any]]:
    """Minibatches of one data set (sliced, shuffled when rng is given) or each item of an iterable."""
    for features, labels, mask, _ in masked_minibatches(data, batch_size, rng):
        yield features, labels, mask


def masked_minibatches(
    data: Any, batch_size: int, rng: np.random.Generator | None
) -> Iterator[tuple[Any, Any, Any, Any]]:
    """As :func:`minibatches`, with each minibatch's features mask (None without one) fourth."""
    if is_single(data):
        x, y, m = unpack(data)
        fm = features_mask_of(data)
        if isinstance(x, list) and hasattr(data, "subset"):  # a MultiDataSet: its arrays sliced together
            yield from _multi_minibatches(data, batch_size, rng)
            return
        n = len(x)
        if n == 0:
            raise InvalidInputError("data set: expected at least one example, got an empty data set")
        order = rng.permutation(n) if rng is not None else None
        for start in range(0, n, batch_size):
            if order is None:
                sl: Any = slice(start, start + batch_size)
            else:
                sl = order[start : start + batch_size]
            yield (x[sl], (y[sl] if y is not None else None), (m[sl] if m is not None else None),
                   (fm[sl] if fm is not None else None))
        return
    if not isinstance(data, Iterable):
        raise InvalidInputError(f"expected a DataSet or an iterable of DataSets, got {type(data).__name__}")
    for item in data:
        yield (*unpack(item), features_mask_of(item))


def _multi_minibatches(data: Any, batch_size: int, rng: np.random.Generator | None) -> Iterator[tuple]:
    n = int(data.num_examples)
    if n == 0:
        raise InvalidInputError("data set: expected at least one example, got an empty data set")
    order = rng.permutation(n) if rng is not None else np.arange(n)
    single = len(data.features) == 1 and len(data.labels) == 1  # 1-in 1-out: the plain arrays
    for start in range(0, n, batch_size):
        part = data.subset(order[start : start + batch_size])
        x, y, m = unpack(part)
        fm = features_mask_of(part)
        yield (x[0], y[0], None if m is None else m[0], fm) if single else (x, y, m, fm)


def check_counter(value: Any, what: str) -> int:
    """An iteration or epoch counter: an int >= 0 (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidInputError(f"{what}: expected an int >= 0, got {value!r}")
    return int(value)


def check_fit(data: Any, epochs: int, batch_size: int) -> None:
    """fit()'s arguments: positive epochs and batch size; a one-shot iterator allows one epoch only."""
    if epochs < 1 or batch_size < 1:
        raise InvalidInputError(f"fit: expected epochs >= 1 and batch_size >= 1, got {epochs}, {batch_size}")
    if not is_single(data) and isinstance(data, Iterable) and iter(data) is data and epochs > 1:
        raise InvalidInputError("fit: a one-shot iterator can be trained for one epoch only; pass a list")


def fit_epochs(net: Any, data: Any, epochs: int, batch_size: int, shuffle: bool) -> None:
    """The single-process training loop of Network and TorchNetwork: ``epochs`` passes of
    compute_update + apply_update, reshuffled per epoch from the seed; no minibatch is an error."""
    check_fit(data, epochs, batch_size)
    for _ in range(epochs):
        rng = np.random.default_rng([net.seed, net.epoch, 7]) if shuffle else None
        seen = 0
        for features, labels, mask, features_mask in masked_minibatches(data, batch_size, rng):
            compute = getattr(net, "compute_update_tensor", net.compute_update)  # a GPU step stays there
            update, _ = compute(features, labels, mask, **step_arguments(compute, features_mask))
            net.apply_update(update)
            seen += 1
        if seen == 0:
            raise InvalidInputError("fit: the data yielded no minibatch")
        net.epoch += 1


class TrainingCounters:
    """The iteration and epoch counters a network's updater schedules read (non-negative ints)."""

    _iteration = 0
    _epoch = 0

    @property
    def iteration(self) -> int:
        return self._iteration

    @iteration.setter
    def iteration(self, value: int) -> None:
        self._iteration = check_counter(value, "iteration")

    @property
    def epoch(self) -> int:
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = check_counter(value, "epoch")
