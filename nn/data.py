"""DataSet and MultiDataSet: the minibatches a worker trains on, and their loaders.

Layout conventions (the network code relies on them):

- ``features``: ``(n, ...)``; a sequence batch is ``(n, T, f)`` with ``features_mask`` ``(n, T)``
  (1 = real step, 0 = padding).
- ``labels``: classification labels are one-hot float32 ``(n, classes)``; regression ``(n, k)``;
  sequence labels ``(n, T, k)`` with ``labels_mask`` ``(n, T)``.
- A per-example mask is ``(n,)``.

File form: ``psrv.nn.data_file`` (one versioned, checksummed minibatch per file). This module
also reads either kind back and holds the loaders.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, Self, runtime_checkable

import numpy as np
from psrv.nn.data_common import (
    ExampleRows,
    as_array,
    check_count,
    check_mask,
    merge_slot,
    one_hot,
    same_arrays,
    take,
)
from psrv.nn.data_file import (
    DATA_FILE_MAGIC,
    DATA_FILE_SUFFIX,
    DATA_FILE_VERSION,
    decode_arrays,
    encode_arrays,
    read_file_bytes,
    write_file_bytes,
)
from psrv.nn.errors import DataError, DataFileError

__all__ = [
    "DATA_FILE_MAGIC",
    "DATA_FILE_SUFFIX",
    "DATA_FILE_VERSION",
    "DataSet",
    "DataSetLoader",
    "FileDataSetLoader",
    "FileMultiDataSetLoader",
    "MultiDataSet",
    "MultiDataSetLoader",
    "decode_arrays",
    "encode_arrays",
    "one_hot",
    "read_data_bytes",
    "read_data_file",
]


def read_data_bytes(blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> DataSet | MultiDataSet:
    """Decode the file form of either kind (what Spark's ``binaryFiles`` hands over)."""
    kind, arrays = decode_arrays(blob, source)
    if kind == "DataSet":
        return DataSet._from_arrays(arrays, source)
    if kind == "MultiDataSet":
        return MultiDataSet._from_arrays(arrays, source)
    raise DataFileError(f"{source}: unknown data file kind {kind!r}; expected 'DataSet' or 'MultiDataSet'")


def read_data_file(path: str | os.PathLike[str]) -> DataSet | MultiDataSet:
    """Read a file written by ``DataSet.save`` or ``MultiDataSet.save``."""
    return read_data_bytes(read_file_bytes(path), os.fspath(path))


# --------------------------------------------------------------------------------------------------
# DataSet
# --------------------------------------------------------------------------------------------------
class _StoredBatch(ExampleRows):
    """The file form both minibatch kinds share (psrv.nn.data_file): each names its ``_FILE_KIND``,
    lists its arrays (``_named_arrays``) and reads itself back (``from_bytes``)."""

    __slots__ = ()
    _FILE_KIND = ""

    def _named_arrays(self) -> list[tuple[str, np.ndarray]]:
        raise NotImplementedError

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> Self:
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        return encode_arrays(self._FILE_KIND, self._named_arrays())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this minibatch to one file (atomically: readers never see half a file)."""
        write_file_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        return cls.from_bytes(read_file_bytes(path), os.fspath(path))


class DataSet(_StoredBatch):
    """One input array and one label array (with optional masks): DL4J's DataSet."""

    _FILE_KIND = "DataSet"

    __slots__ = ("features", "labels", "features_mask", "labels_mask")

    def __init__(
        self,
        features: np.ndarray,
        labels: np.ndarray,
        features_mask: np.ndarray | None = None,
        labels_mask: np.ndarray | None = None,
    ) -> None:
        self.features = as_array(features, "features")
        self.labels = as_array(labels, "labels")
        check_count([self.features, self.labels], ["features", "labels"])
        n = self.features.shape[0]
        self.features_mask = check_mask(features_mask, n, self.features, "features_mask")
        self.labels_mask = check_mask(labels_mask, n, self.labels, "labels_mask")

    # -- sizes -------------------------------------------------------------------------------
    @property
    def num_examples(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_inputs(self) -> int:
        """Width of the last feature axis."""
        return int(self.features.shape[-1]) if self.features.ndim > 1 else 1

    @property
    def num_outcomes(self) -> int:
        """Width of the last label axis (the number of classes for one-hot labels)."""
        return int(self.labels.shape[-1]) if self.labels.ndim > 1 else 1

    def __repr__(self) -> str:
        masks = []
        if self.features_mask is not None:
            masks.append(f"features_mask={self.features_mask.shape}")
        if self.labels_mask is not None:
            masks.append(f"labels_mask={self.labels_mask.shape}")
        extra = (", " + ", ".join(masks)) if masks else ""
        return f"DataSet(features={self.features.shape}, labels={self.labels.shape}{extra})"

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_class_indices(
        cls, features: np.ndarray, class_indices: np.ndarray, num_classes: int | None = None
    ) -> DataSet:
        """Classification data from integer class labels; labels become one-hot float32."""
        indices = as_array(class_indices, "class_indices")
        if indices.ndim != 1 or indices.dtype.kind not in "iu":
            raise DataError(
                f"class_indices: expected a 1-D integer array, got {indices.dtype} {indices.shape}"
            )
        if num_classes is None:
            num_classes = int(indices.max()) + 1 if indices.size else 0
        if indices.size and (indices.min() < 0 or indices.max() >= num_classes):
            raise DataError(
                f"class_indices: expected values in [0, {num_classes}), got range "
                f"[{int(indices.min())}, {int(indices.max())}]"
            )
        return cls(features, one_hot(indices, num_classes))

    def copy(self) -> DataSet:
        return DataSet(
            self.features.copy(),
            self.labels.copy(),
            None if self.features_mask is None else self.features_mask.copy(),
            None if self.labels_mask is None else self.labels_mask.copy(),
        )

    def subset(self, index: np.ndarray | slice) -> DataSet:
        """The examples at ``index`` (an index array or a slice) as a new DataSet."""
        return DataSet(
            self.features[index],
            self.labels[index],
            take(self.features_mask, index),
            take(self.labels_mask, index),
        )

    def label_indices(self) -> np.ndarray:
        """Class index per example (argmax of one-hot labels over the last axis)."""
        if self.labels.ndim == 1:
            return self.labels.astype(np.int64)
        return np.argmax(self.labels, axis=-1)

    def to_multi(self) -> MultiDataSet:
        return MultiDataSet([self.features], [self.labels], [self.features_mask], [self.labels_mask])

    def equals(self, other: object) -> bool:
        """Exact equality of every array and mask (dtypes included)."""
        if not isinstance(other, DataSet):
            return False
        pairs = [
            (self.features, other.features),
            (self.labels, other.labels),
            (self.features_mask, other.features_mask),
            (self.labels_mask, other.labels_mask),
        ]
        return all(same_arrays(a, b) for a, b in pairs)

    # -- merging -----------------------------------------------------------------------------
    @staticmethod
    def merge(datasets: Iterable[DataSet]) -> DataSet:
        """One DataSet holding every example, in order; sequences of different lengths are padded."""
        items = DataSet._items_to_merge(datasets)
        features, features_mask = merge_slot(
            [d.features for d in items], [d.features_mask for d in items], "features"
        )
        labels, labels_mask = merge_slot([d.labels for d in items], [d.labels_mask for d in items], "labels")
        return DataSet(features, labels, features_mask, labels_mask)

    # -- file form ---------------------------------------------------------------------------
    def _named_arrays(self) -> list[tuple[str, np.ndarray]]:
        arrays = [("features", self.features), ("labels", self.labels)]
        if self.features_mask is not None:
            arrays.append(("features_mask", self.features_mask))
        if self.labels_mask is not None:
            arrays.append(("labels_mask", self.labels_mask))
        return arrays

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> DataSet:
        data = read_data_bytes(blob, source)
        return _as_dataset(data, source)

    @classmethod
    def _from_arrays(cls, arrays: dict[str, np.ndarray], source: str) -> DataSet:
        try:
            return cls(
                arrays["features"], arrays["labels"], arrays.get("features_mask"), arrays.get("labels_mask")
            )
        except KeyError as exc:
            raise DataFileError(f"{source}: DataSet file lacks array {exc}") from exc
        except DataError as exc:
            raise DataFileError(f"{source}: inconsistent DataSet file ({exc})") from exc


# --------------------------------------------------------------------------------------------------
# MultiDataSet: several input arrays and several label arrays, DL4J's MultiDataSet
# --------------------------------------------------------------------------------------------------
def _as_list(values: object, what: str) -> list[np.ndarray]:
    if isinstance(values, np.ndarray):
        return [as_array(values, f"{what}[0]")]
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise DataError(f"{what}: expected a list of arrays, got {type(values).__name__}")
    return [as_array(v, f"{what}[{i}]") for i, v in enumerate(values)]


def _mask_list(
    masks: Sequence[np.ndarray | None] | None, datas: list[np.ndarray], n: int, what: str
) -> list[np.ndarray | None]:
    if masks is None:
        return [None] * len(datas)
    if len(masks) != len(datas):
        raise DataError(
            f"{what}: expected {len(datas)} masks (one per array, None allowed), got {len(masks)}"
        )
    return [check_mask(m, n, d, f"{what}[{i}]") for i, (m, d) in enumerate(zip(masks, datas, strict=True))]


class MultiDataSet(_StoredBatch):
    """Several input arrays and several label arrays (with optional masks): DL4J's MultiDataSet."""

    _FILE_KIND = "MultiDataSet"

    __slots__ = ("features", "labels", "features_masks", "labels_masks")

    def __init__(
        self,
        features: Sequence[np.ndarray],
        labels: Sequence[np.ndarray],
        features_masks: Sequence[np.ndarray | None] | None = None,
        labels_masks: Sequence[np.ndarray | None] | None = None,
    ) -> None:
        self.features = _as_list(features, "features")
        self.labels = _as_list(labels, "labels")
        if not self.features:
            raise DataError("features: expected at least one input array, got none")
        names = [f"features[{i}]" for i in range(len(self.features))] + [
            f"labels[{i}]" for i in range(len(self.labels))
        ]
        n = check_count(self.features + self.labels, names)
        self.features_masks = _mask_list(features_masks, self.features, n, "features_masks")
        self.labels_masks = _mask_list(labels_masks, self.labels, n, "labels_masks")

    @property
    def num_examples(self) -> int:
        return int(self.features[0].shape[0])

    @property
    def num_feature_arrays(self) -> int:
        return len(self.features)

    @property
    def num_label_arrays(self) -> int:
        return len(self.labels)

    @property
    def labels_mask(self) -> list[np.ndarray | None] | None:
        """The labels masks as a network's ``compute_update(features, labels, mask)`` takes them (what a
        DataSet's ``labels_mask`` is for one output): one per output, or None when no output has one."""
        return None if all(m is None for m in self.labels_masks) else list(self.labels_masks)

    def __repr__(self) -> str:
        return (
            f"MultiDataSet(features={[f.shape for f in self.features]}, "
            f"labels={[lab.shape for lab in self.labels]})"
        )

    def subset(self, index: np.ndarray | slice) -> MultiDataSet:
        return MultiDataSet(
            [f[index] for f in self.features],
            [lab[index] for lab in self.labels],
            [take(m, index) for m in self.features_masks],
            [take(m, index) for m in self.labels_masks],
        )

    def copy(self) -> MultiDataSet:
        return self.subset(np.arange(self.num_examples))

    def to_dataset(self) -> DataSet:
        """The single-input single-output case as a DataSet."""
        if len(self.features) != 1 or len(self.labels) != 1:
            raise DataError(
                f"expected 1 feature and 1 label array to convert to a DataSet, got {len(self.features)} "
                f"and {len(self.labels)}"
            )
        return DataSet(self.features[0], self.labels[0], self.features_masks[0], self.labels_masks[0])

    def equals(self, other: object) -> bool:
        if not isinstance(other, MultiDataSet):
            return False
        mine = self.features + self.labels + self.features_masks + self.labels_masks
        theirs = other.features + other.labels + other.features_masks + other.labels_masks
        return (
            len(mine) == len(theirs)
            and len(self.features) == len(other.features)
            and all(same_arrays(a, b) for a, b in zip(mine, theirs, strict=True))
        )

    @staticmethod
    def merge(datasets: Iterable[MultiDataSet]) -> MultiDataSet:
        items = MultiDataSet._items_to_merge(datasets)
        layouts = {(len(d.features), len(d.labels)) for d in items}
        if len(layouts) > 1:
            raise DataError(f"MultiDataSet.merge: (features, labels) array counts differ: {sorted(layouts)}")
        n_features, n_labels = layouts.pop()
        features, features_masks, labels, labels_masks = [], [], [], []
        for i in range(n_features):
            data, mask = merge_slot(
                [d.features[i] for d in items], [d.features_masks[i] for d in items], f"features[{i}]"
            )
            features.append(data)
            features_masks.append(mask)
        for i in range(n_labels):
            data, mask = merge_slot(
                [d.labels[i] for d in items], [d.labels_masks[i] for d in items], f"labels[{i}]"
            )
            labels.append(data)
            labels_masks.append(mask)
        return MultiDataSet(features, labels, features_masks, labels_masks)

    def _named_arrays(self) -> list[tuple[str, np.ndarray]]:
        arrays: list[tuple[str, np.ndarray]] = []
        for prefix, values in (
            ("features", self.features),
            ("labels", self.labels),
            ("features_mask", self.features_masks),
            ("labels_mask", self.labels_masks),
        ):
            for i, value in enumerate(values):
                if value is not None:
                    arrays.append((f"{prefix}/{i}", value))
        arrays.append(("layout", np.array([len(self.features), len(self.labels)], dtype=np.int64)))
        return arrays

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> MultiDataSet:
        data = read_data_bytes(blob, source)
        return data.to_multi() if isinstance(data, DataSet) else data

    @classmethod
    def _from_arrays(cls, arrays: dict[str, np.ndarray], source: str) -> MultiDataSet:
        try:
            n_features, n_labels = (int(v) for v in arrays["layout"])
            features = [arrays[f"features/{i}"] for i in range(n_features)]
            labels = [arrays[f"labels/{i}"] for i in range(n_labels)]
            features_masks = [arrays.get(f"features_mask/{i}") for i in range(n_features)]
            labels_masks = [arrays.get(f"labels_mask/{i}") for i in range(n_labels)]
            return cls(features, labels, features_masks, labels_masks)
        except KeyError as exc:
            raise DataFileError(f"{source}: MultiDataSet file lacks array {exc}") from exc
        except (DataError, ValueError) as exc:
            raise DataFileError(f"{source}: inconsistent MultiDataSet file ({exc})") from exc


# --------------------------------------------------------------------------------------------------
# loaders: how a worker turns a path into a minibatch (custom formats plug in here)
# --------------------------------------------------------------------------------------------------
@runtime_checkable
class DataSetLoader(Protocol):
    """Turns a path into a DataSet; implement it to train from your own file format."""

    def load(self, path: str) -> DataSet: ...


@runtime_checkable
class MultiDataSetLoader(Protocol):
    def load(self, path: str) -> MultiDataSet: ...


class FileDataSetLoader:
    """Reads the psrv file form (``DataSet.save``): any path or URI the storage layer reaches; in a
    Spark task it is handed a stream opened there (``load_stream``). A file holding a MultiDataSet of
    several inputs or outputs (what psrv.spark exports for a TorchNetwork of several) comes back as it is;
    one of a single input and output as a DataSet."""

    def load(self, path: str) -> DataSet | MultiDataSet:
        return _minibatch(read_data_bytes(read_file_bytes(path), os.fspath(path)), os.fspath(path))

    def load_stream(self, stream: Any, path: str) -> DataSet | MultiDataSet:
        return _minibatch(read_data_bytes(stream.read(), path), path)

    def __repr__(self) -> str:
        return "FileDataSetLoader()"


class FileMultiDataSetLoader:
    """Reads the psrv file form as a MultiDataSet (a DataSet file becomes a 1-in 1-out MultiDataSet)."""

    def load(self, path: str) -> MultiDataSet:
        return MultiDataSet.load(path)

    def load_stream(self, stream: Any, path: str) -> MultiDataSet:
        return MultiDataSet.from_bytes(stream.read(), path)

    def __repr__(self) -> str:
        return "FileMultiDataSetLoader()"


def _minibatch(data: DataSet | MultiDataSet, source: str) -> DataSet | MultiDataSet:
    if isinstance(data, MultiDataSet) and (data.num_feature_arrays != 1 or data.num_label_arrays != 1):
        return data
    return _as_dataset(data, source)


def _as_dataset(data: DataSet | MultiDataSet, source: str) -> DataSet:
    if isinstance(data, DataSet):
        return data
    try:
        return data.to_dataset()
    except DataError as exc:
        raise DataFileError(f"{source}: holds a MultiDataSet that is not a DataSet ({exc})") from exc
