"""What DataSet and MultiDataSet share: validation, padding merges, and reordering and batching."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Self

import numpy as np
from psrv.nn.errors import DataError

#: bool, signed, unsigned, float: never object arrays (from a caller or from a file)
__all__ = [
    "NUMERIC_KINDS",
    "ExampleRows",
    "as_array",
    "as_generator",
    "check_batch_size",
    "check_count",
    "check_mask",
    "merge_slot",
    "one_hot",
    "same_arrays",
    "split_count",
    "split_order",
    "take",
]

NUMERIC_KINDS = "biuf"


def as_array(value: object, what: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything numpy refuses is bad input
        raise DataError(f"{what}: expected a numeric array, got {type(value).__name__} ({exc})") from exc
    if array.dtype.kind not in NUMERIC_KINDS:
        raise DataError(f"{what}: expected a numeric array (bool/int/float), got dtype {array.dtype}")
    if array.ndim == 0:
        raise DataError(f"{what}: expected an array with a leading example axis, got a scalar")
    return array


def check_mask(mask: object | None, n: int, data: np.ndarray, what: str) -> np.ndarray | None:
    if mask is None:
        return None
    m = as_array(mask, what)
    if m.shape[0] != n:
        raise DataError(f"{what}: expected {n} rows (one per example), got shape {m.shape}")
    if m.ndim == 1:
        return m
    if m.ndim >= 3 and (m.shape == data.shape or m.shape[1:] == data.shape[1:m.ndim]
                        or m.shape[1:] == data.shape[2:]):
        return m  # per element, per position (n, T, ...), or per pixel of channels-first (n, C, H, W)
    if m.ndim == 2:
        # (n, T) for sequences, or (n, k) per output column (regression masks)
        if data.ndim >= 2 and data.shape[1] == m.shape[1]:
            return m
        raise DataError(
            f"{what}: expected shape ({n},) or ({n}, {data.shape[1] if data.ndim >= 2 else '?'}) "
            f"matching data of shape {data.shape}, got {m.shape}"
        )
    raise DataError(f"{what}: expected a mask of shape ({n},), the data's shape {data.shape} or its leading "
                    f"axes, or its positions without the channel axis 1, got {m.shape}")


def check_count(arrays: Sequence[np.ndarray], names: Sequence[str]) -> int:
    counts = {name: a.shape[0] for name, a in zip(names, arrays, strict=True)}
    distinct = set(counts.values())
    if len(distinct) > 1:
        detail = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise DataError(f"every array must hold the same number of examples, got {detail}")
    return distinct.pop() if distinct else 0


def as_generator(seed: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def take(array: np.ndarray | None, index: np.ndarray | slice) -> np.ndarray | None:
    if array is None:
        return None
    return array[index]


def _pad_time(array: np.ndarray, length: int) -> np.ndarray:
    if array.shape[1] == length:
        return array
    pad = [(0, 0)] * array.ndim
    pad[1] = (0, length - array.shape[1])
    return np.pad(array, pad)


def merge_slot(
    datas: list[np.ndarray], masks: list[np.ndarray | None], what: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate one data slot (and its masks); sequences of different lengths are zero-padded."""
    shapes = {d.shape[1:] for d in datas}
    if len(shapes) > 1:
        ndims = {d.ndim for d in datas}
        trailing = {d.shape[2:] for d in datas}
        if ndims != {3} or len(trailing) != 1:
            raise DataError(
                f"{what}: cannot merge arrays of shapes {sorted(d.shape for d in datas)}; only sequence "
                "batches (n, T, f) may differ, and only in T"
            )
        length = max(d.shape[1] for d in datas)
        new_masks: list[np.ndarray] = []
        for d, m in zip(datas, masks, strict=True):
            if m is None:
                m = np.ones(d.shape[:2], dtype=np.float32)
            elif m.ndim != 2:
                raise DataError(f"{what}: sequence mask must be (n, T), got {m.shape}")
            new_masks.append(_pad_time(m, length))
        datas = [_pad_time(d, length) for d in datas]
        return np.concatenate(datas), np.concatenate(new_masks)
    merged = np.concatenate(datas)
    if all(m is None for m in masks):
        return merged, None
    mask_shapes = {m.shape[1:] for m in masks if m is not None}
    if len(mask_shapes) > 1:
        raise DataError(f"{what}: cannot merge masks of shapes {sorted(mask_shapes)}")
    tail = mask_shapes.pop()
    dtype = next(m.dtype for m in masks if m is not None)
    filled = [
        np.ones((d.shape[0], *tail), dtype=dtype) if m is None else m
        for d, m in zip(datas, masks, strict=True)
    ]
    return merged, np.concatenate(filled)


def one_hot(class_indices: np.ndarray, num_classes: int) -> np.ndarray:
    """float32 one-hot rows for integer class indices."""
    indices = np.asarray(class_indices, dtype=np.int64)
    out = np.zeros((indices.shape[0], num_classes), dtype=np.float32)
    out[np.arange(indices.shape[0]), indices] = 1.0
    return out



def same_arrays(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def check_batch_size(batch_size: object, what: str = "batch_size") -> int:
    """``batch_size`` (or another count named ``what``) as a positive int; the one check of psrv's batch
    sizes (psrv.spark re-raises it as its configuration error)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise DataError(f"{what}: expected a positive integer, got {batch_size!r}")
    return int(batch_size)


def split_count(fraction_train: float, n: int) -> int:
    if not 0.0 <= float(fraction_train) <= 1.0:
        raise DataError(f"fraction_train: expected a number in [0, 1], got {fraction_train!r}")
    return int(round(float(fraction_train) * n))


def split_order(seed: int | np.random.Generator | None, n: int) -> np.ndarray:
    return as_generator(seed).permutation(n) if seed is not None else np.arange(n)


class ExampleRows:
    """Reordering and slicing of a batch of examples, all built on ``subset`` and ``num_examples``."""

    __slots__ = ()

    @property
    def num_examples(self) -> int:
        raise NotImplementedError

    def subset(self, index: np.ndarray | slice) -> Self:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.num_examples

    def shuffle(self, seed: int | np.random.Generator | None = None) -> Self:
        """A copy with the examples in a random order (the original is untouched)."""
        return self.subset(as_generator(seed).permutation(self.num_examples))

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int | np.random.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[Self]:
        """Minibatches of ``batch_size`` examples (the last one smaller unless ``drop_last``)."""
        check_batch_size(batch_size)
        order = as_generator(seed).permutation(self.num_examples) if shuffle else None
        for start in range(0, self.num_examples, batch_size):
            stop = min(start + batch_size, self.num_examples)
            if drop_last and stop - start < batch_size:
                return
            yield self.subset(order[start:stop] if order is not None else slice(start, stop))

    def split(
        self, fraction_train: float, *, seed: int | np.random.Generator | None = None
    ) -> tuple[Self, Self]:
        """(train, test): ``round(fraction_train * n)`` examples go to train; shuffled when seeded."""
        n_train = split_count(fraction_train, self.num_examples)
        order = split_order(seed, self.num_examples)
        return self.subset(order[:n_train]), self.subset(order[n_train:])

    @classmethod
    def _items_to_merge(cls, datasets: Iterable[Any]) -> list[Self]:
        """The merge() argument as a list, checked: at least one item, each of this class."""
        name = cls.__name__
        items = list(datasets)
        if not items:
            raise DataError(f"{name}.merge: expected at least one {name}, got none")
        for i, item in enumerate(items):
            if not isinstance(item, cls):
                raise DataError(f"{name}.merge: item {i} is a {type(item).__name__}, expected {name}")
        return items
