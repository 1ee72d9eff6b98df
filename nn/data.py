"""DataSet and MultiDataSet: the minibatches a worker trains on, and their file form.

Layout conventions (the network code relies on them):

- ``features``: ``(n, ...)``; a sequence batch is ``(n, T, f)`` with ``features_mask`` ``(n, T)``
  (1 = real step, 0 = padding).
- ``labels``: classification labels are one-hot float32 ``(n, classes)``; regression ``(n, k)``;
  sequence labels ``(n, T, k)`` with ``labels_mask`` ``(n, T)``.
- A per-example mask is ``(n,)``.

File form (one minibatch per file, versioned, checked on read)::

    8 bytes  magic b"PSRVDATA"
    4 bytes  format version (uint32, little endian)
    4 bytes  header length H (uint32, little endian)
    H bytes  header: UTF-8 JSON {"kind", "arrays": [{name, dtype, shape, offset, nbytes}],
             "payload_bytes", "crc32"}
    payload  the raw little-endian arrays, back to back

A truncated, corrupt (CRC mismatch), foreign or newer-version file raises ``DataFileError``.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
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

DATA_FILE_MAGIC = b"PSRVDATA"
DATA_FILE_VERSION = 1
DATA_FILE_SUFFIX = ".psds"
_PREAMBLE = struct.Struct("<8sII")
_MAX_HEADER_BYTES = 16 * 1024 * 1024
_ALLOWED_KINDS = "biuf"  # bool, signed, unsigned, float: never object arrays from a file


# --------------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------------
def _as_array(value: object, what: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything numpy refuses is bad input
        raise DataError(f"{what}: expected a numeric array, got {type(value).__name__} ({exc})") from exc
    if array.dtype.kind not in _ALLOWED_KINDS:
        raise DataError(f"{what}: expected a numeric array (bool/int/float), got dtype {array.dtype}")
    if array.ndim == 0:
        raise DataError(f"{what}: expected an array with a leading example axis, got a scalar")
    return array


def _check_mask(mask: object | None, n: int, data: np.ndarray, what: str) -> np.ndarray | None:
    if mask is None:
        return None
    m = _as_array(mask, what)
    if m.shape[0] != n:
        raise DataError(f"{what}: expected {n} rows (one per example), got shape {m.shape}")
    if m.ndim == 1:
        return m
    if m.ndim == 2:
        # (n, T) for sequences, or (n, k) per output column (regression masks)
        if data.ndim >= 2 and data.shape[1] == m.shape[1]:
            return m
        raise DataError(
            f"{what}: expected shape ({n},) or ({n}, {data.shape[1] if data.ndim >= 2 else '?'}) "
            f"matching data of shape {data.shape}, got {m.shape}"
        )
    raise DataError(f"{what}: expected a 1-D or 2-D mask, got shape {m.shape}")


def _check_count(arrays: Sequence[np.ndarray], names: Sequence[str]) -> int:
    counts = {name: a.shape[0] for name, a in zip(names, arrays, strict=True)}
    distinct = set(counts.values())
    if len(distinct) > 1:
        detail = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise DataError(f"every array must hold the same number of examples, got {detail}")
    return distinct.pop() if distinct else 0


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def _take(array: np.ndarray | None, index: np.ndarray | slice) -> np.ndarray | None:
    if array is None:
        return None
    return array[index]


# --------------------------------------------------------------------------------------------------
# merging with padding of variable-length sequences
# --------------------------------------------------------------------------------------------------
def _pad_time(array: np.ndarray, length: int) -> np.ndarray:
    if array.shape[1] == length:
        return array
    pad = [(0, 0)] * array.ndim
    pad[1] = (0, length - array.shape[1])
    return np.pad(array, pad)


def _merge_slot(
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


# --------------------------------------------------------------------------------------------------
# the file form
# --------------------------------------------------------------------------------------------------
def _encode(kind: str, arrays: list[tuple[str, np.ndarray]]) -> bytes:
    entries = []
    chunks = []
    offset = 0
    for name, array in arrays:
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        raw = little.tobytes()
        entries.append(
            {
                "name": name,
                "dtype": little.dtype.str,
                "shape": list(little.shape),
                "offset": offset,
                "nbytes": len(raw),
            }
        )
        chunks.append(raw)
        offset += len(raw)
    payload = b"".join(chunks)
    header = json.dumps(
        {"kind": kind, "arrays": entries, "payload_bytes": len(payload), "crc32": zlib.crc32(payload)},
        separators=(",", ":"),
    ).encode("utf-8")
    return _PREAMBLE.pack(DATA_FILE_MAGIC, DATA_FILE_VERSION, len(header)) + header + payload


def _decode(blob: bytes | bytearray | memoryview, source: str) -> tuple[str, dict[str, np.ndarray]]:
    view = memoryview(blob).cast("B")
    if len(view) < _PREAMBLE.size:
        raise DataFileError(
            f"{source}: not a psrv data file: {len(view)} bytes, shorter than the {_PREAMBLE.size}-byte "
            "preamble (truncated?)"
        )
    magic, version, header_len = _PREAMBLE.unpack_from(view, 0)
    if magic != DATA_FILE_MAGIC:
        raise DataFileError(
            f"{source}: not a psrv data file: expected magic {DATA_FILE_MAGIC!r}, got {magic!r}"
        )
    if version != DATA_FILE_VERSION:
        raise DataFileError(
            f"{source}: unsupported psrv data file version {version}; this build reads version "
            f"{DATA_FILE_VERSION}"
        )
    if header_len > _MAX_HEADER_BYTES or _PREAMBLE.size + header_len > len(view):
        raise DataFileError(
            f"{source}: truncated psrv data file: header of {header_len} bytes announced, "
            f"{len(view) - _PREAMBLE.size} bytes follow the preamble"
        )
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : _PREAMBLE.size + header_len]).decode("utf-8"))
        kind = str(header["kind"])
        entries = list(header["arrays"])
        payload_bytes = int(header["payload_bytes"])
        crc = int(header["crc32"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataFileError(f"{source}: corrupt psrv data file header ({exc})") from exc
    start = _PREAMBLE.size + header_len
    payload = view[start:]
    if len(payload) != payload_bytes:
        what = "truncated" if len(payload) < payload_bytes else "over-long"
        raise DataFileError(
            f"{source}: {what} psrv data file: expected {payload_bytes} payload bytes, got {len(payload)}"
        )
    if zlib.crc32(payload) != crc:
        raise DataFileError(f"{source}: corrupt psrv data file: payload checksum mismatch")
    arrays: dict[str, np.ndarray] = {}
    try:
        for entry in entries:
            dtype = np.dtype(entry["dtype"])
            if dtype.kind not in _ALLOWED_KINDS:
                raise DataFileError(f"{source}: refusing array {entry['name']!r} of dtype {dtype}")
            shape = tuple(int(s) for s in entry["shape"])
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
            if (
                nbytes != dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                or offset < 0
                or (offset + nbytes > payload_bytes)
            ):
                raise DataFileError(
                    f"{source}: corrupt psrv data file: array {entry['name']!r} out of bounds"
                )
            data = np.frombuffer(payload[offset : offset + nbytes], dtype=dtype).reshape(shape)
            arrays[str(entry["name"])] = data.astype(dtype.newbyteorder("="), copy=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataFileError(f"{source}: corrupt psrv data file header ({exc})") from exc
    return kind, arrays


def _write_atomically(path: str | os.PathLike[str], blob: bytes) -> None:
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=DATA_FILE_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _local_path(path: str | os.PathLike[str]) -> str:
    path = os.fspath(path)
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("file:"):
        return path[len("file:") :]
    return path


def _read_file(path: str | os.PathLike[str]) -> bytes:
    local = _local_path(path)
    if "://" in local:
        raise DataFileError(
            f"{path}: only local paths can be read here; read Hadoop-style URIs through Spark "
            "(psrv.spark.data) and pass the bytes to read_data_bytes()"
        )
    try:
        with open(local, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise DataFileError(f"{path}: cannot read data file ({exc.strerror or exc})") from exc


def encode_arrays(kind: str, arrays: list[tuple[str, np.ndarray]]) -> bytes:
    """The psrv file form for any named numeric arrays (used by other batch kinds, e.g. image batches)."""
    return _encode(kind, arrays)


def decode_arrays(
    blob: bytes | bytearray | memoryview, source: str = "<bytes>"
) -> tuple[str, dict[str, np.ndarray]]:
    """(kind, arrays) of a psrv data file, fully checked; raises DataFileError."""
    return _decode(blob, source)


def read_data_bytes(blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> DataSet | MultiDataSet:
    """Decode the file form of either kind (what Spark's ``binaryFiles`` hands over)."""
    kind, arrays = _decode(blob, source)
    if kind == "DataSet":
        return DataSet._from_arrays(arrays, source)
    if kind == "MultiDataSet":
        return MultiDataSet._from_arrays(arrays, source)
    raise DataFileError(f"{source}: unknown data file kind {kind!r}; expected 'DataSet' or 'MultiDataSet'")


def read_data_file(path: str | os.PathLike[str]) -> DataSet | MultiDataSet:
    """Read a file written by ``DataSet.save`` or ``MultiDataSet.save``."""
    return read_data_bytes(_read_file(path), os.fspath(path))


# --------------------------------------------------------------------------------------------------
# DataSet
# --------------------------------------------------------------------------------------------------
class DataSet:
    """One input array and one label array (with optional masks): DL4J's DataSet."""

    __slots__ = ("features", "labels", "features_mask", "labels_mask")

    def __init__(
        self,
        features: np.ndarray,
        labels: np.ndarray,
        features_mask: np.ndarray | None = None,
        labels_mask: np.ndarray | None = None,
    ) -> None:
        self.features = _as_array(features, "features")
        self.labels = _as_array(labels, "labels")
        _check_count([self.features, self.labels], ["features", "labels"])
        n = self.features.shape[0]
        self.features_mask = _check_mask(features_mask, n, self.features, "features_mask")
        self.labels_mask = _check_mask(labels_mask, n, self.labels, "labels_mask")

    # -- sizes -------------------------------------------------------------------------------
    @property
    def num_examples(self) -> int:
        return int(self.features.shape[0])

    def __len__(self) -> int:
        return self.num_examples

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
        indices = _as_array(class_indices, "class_indices")
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
            _take(self.features_mask, index),
            _take(self.labels_mask, index),
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
        return all(_same(a, b) for a, b in pairs)

    # -- reordering and slicing --------------------------------------------------------------
    def shuffle(self, seed: int | np.random.Generator | None = None) -> DataSet:
        """A new DataSet with the examples in a random order (the original is untouched)."""
        return self.subset(_rng(seed).permutation(self.num_examples))

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int | np.random.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[DataSet]:
        """Minibatches of ``batch_size`` examples (the last one smaller unless ``drop_last``)."""
        _check_batch_size(batch_size)
        order = _rng(seed).permutation(self.num_examples) if shuffle else None
        for start in range(0, self.num_examples, batch_size):
            stop = min(start + batch_size, self.num_examples)
            if drop_last and stop - start < batch_size:
                return
            yield self.subset(order[start:stop] if order is not None else slice(start, stop))

    def split(
        self, fraction_train: float, *, seed: int | np.random.Generator | None = None
    ) -> tuple[DataSet, DataSet]:
        """(train, test): ``round(fraction_train * n)`` examples go to train; shuffled when seeded."""
        n_train = _split_count(fraction_train, self.num_examples)
        order = _split_order(seed, self.num_examples)
        return self.subset(order[:n_train]), self.subset(order[n_train:])

    # -- merging -----------------------------------------------------------------------------
    @staticmethod
    def merge(datasets: Iterable[DataSet]) -> DataSet:
        """One DataSet holding every example, in order; sequences of different lengths are padded."""
        items = list(datasets)
        if not items:
            raise DataError("DataSet.merge: expected at least one DataSet, got none")
        for i, item in enumerate(items):
            if not isinstance(item, DataSet):
                raise DataError(f"DataSet.merge: item {i} is a {type(item).__name__}, expected DataSet")
        features, features_mask = _merge_slot(
            [d.features for d in items], [d.features_mask for d in items], "features"
        )
        labels, labels_mask = _merge_slot([d.labels for d in items], [d.labels_mask for d in items], "labels")
        return DataSet(features, labels, features_mask, labels_mask)

    # -- file form ---------------------------------------------------------------------------
    def _named_arrays(self) -> list[tuple[str, np.ndarray]]:
        arrays = [("features", self.features), ("labels", self.labels)]
        if self.features_mask is not None:
            arrays.append(("features_mask", self.features_mask))
        if self.labels_mask is not None:
            arrays.append(("labels_mask", self.labels_mask))
        return arrays

    def to_bytes(self) -> bytes:
        return _encode("DataSet", self._named_arrays())

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> DataSet:
        data = read_data_bytes(blob, source)
        return _as_dataset(data, source)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this minibatch to one file (atomically: readers never see half a file)."""
        _write_atomically(_local_path(path), self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DataSet:
        return cls.from_bytes(_read_file(path), os.fspath(path))

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
# MultiDataSet
# --------------------------------------------------------------------------------------------------
def _as_list(values: object, what: str) -> list[np.ndarray]:
    if isinstance(values, np.ndarray):
        return [_as_array(values, f"{what}[0]")]
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise DataError(f"{what}: expected a list of arrays, got {type(values).__name__}")
    return [_as_array(v, f"{what}[{i}]") for i, v in enumerate(values)]


def _mask_list(
    masks: Sequence[np.ndarray | None] | None, datas: list[np.ndarray], n: int, what: str
) -> list[np.ndarray | None]:
    if masks is None:
        return [None] * len(datas)
    if len(masks) != len(datas):
        raise DataError(
            f"{what}: expected {len(datas)} masks (one per array, None allowed), got {len(masks)}"
        )
    return [_check_mask(m, n, d, f"{what}[{i}]") for i, (m, d) in enumerate(zip(masks, datas, strict=True))]


class MultiDataSet:
    """Several input arrays and several label arrays (with optional masks): DL4J's MultiDataSet."""

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
        n = _check_count(self.features + self.labels, names)
        self.features_masks = _mask_list(features_masks, self.features, n, "features_masks")
        self.labels_masks = _mask_list(labels_masks, self.labels, n, "labels_masks")

    @property
    def num_examples(self) -> int:
        return int(self.features[0].shape[0])

    def __len__(self) -> int:
        return self.num_examples

    @property
    def num_feature_arrays(self) -> int:
        return len(self.features)

    @property
    def num_label_arrays(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return (
            f"MultiDataSet(features={[f.shape for f in self.features]}, "
            f"labels={[lab.shape for lab in self.labels]})"
        )

    def subset(self, index: np.ndarray | slice) -> MultiDataSet:
        return MultiDataSet(
            [f[index] for f in self.features],
            [lab[index] for lab in self.labels],
            [_take(m, index) for m in self.features_masks],
            [_take(m, index) for m in self.labels_masks],
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
            and all(_same(a, b) for a, b in zip(mine, theirs, strict=True))
        )

    def shuffle(self, seed: int | np.random.Generator | None = None) -> MultiDataSet:
        return self.subset(_rng(seed).permutation(self.num_examples))

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int | np.random.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[MultiDataSet]:
        _check_batch_size(batch_size)
        order = _rng(seed).permutation(self.num_examples) if shuffle else None
        for start in range(0, self.num_examples, batch_size):
            stop = min(start + batch_size, self.num_examples)
            if drop_last and stop - start < batch_size:
                return
            yield self.subset(order[start:stop] if order is not None else slice(start, stop))

    def split(
        self, fraction_train: float, *, seed: int | np.random.Generator | None = None
    ) -> tuple[MultiDataSet, MultiDataSet]:
        n_train = _split_count(fraction_train, self.num_examples)
        order = _split_order(seed, self.num_examples)
        return self.subset(order[:n_train]), self.subset(order[n_train:])

    @staticmethod
    def merge(datasets: Iterable[MultiDataSet]) -> MultiDataSet:
        items = list(datasets)
        if not items:
            raise DataError("MultiDataSet.merge: expected at least one MultiDataSet, got none")
        for i, item in enumerate(items):
            if not isinstance(item, MultiDataSet):
                raise DataError(
                    f"MultiDataSet.merge: item {i} is a {type(item).__name__}, expected MultiDataSet"
                )
        layouts = {(len(d.features), len(d.labels)) for d in items}
        if len(layouts) > 1:
            raise DataError(f"MultiDataSet.merge: (features, labels) array counts differ: {sorted(layouts)}")
        n_features, n_labels = layouts.pop()
        features, features_masks, labels, labels_masks = [], [], [], []
        for i in range(n_features):
            data, mask = _merge_slot(
                [d.features[i] for d in items], [d.features_masks[i] for d in items], f"features[{i}]"
            )
            features.append(data)
            features_masks.append(mask)
        for i in range(n_labels):
            data, mask = _merge_slot(
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

    def to_bytes(self) -> bytes:
        return _encode("MultiDataSet", self._named_arrays())

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> MultiDataSet:
        data = read_data_bytes(blob, source)
        return data.to_multi() if isinstance(data, DataSet) else data

    def save(self, path: str | os.PathLike[str]) -> None:
        _write_atomically(_local_path(path), self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MultiDataSet:
        return cls.from_bytes(_read_file(path), os.fspath(path))

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
    """Reads the psrv file form (``DataSet.save``); local paths and ``file:`` URIs."""

    def load(self, path: str) -> DataSet:
        return DataSet.load(path)

    def __repr__(self) -> str:
        return "FileDataSetLoader()"


class FileMultiDataSetLoader:
    """Reads the psrv file form as a MultiDataSet (a DataSet file becomes a 1-in 1-out MultiDataSet)."""

    def load(self, path: str) -> MultiDataSet:
        return MultiDataSet.load(path)

    def __repr__(self) -> str:
        return "FileMultiDataSetLoader()"


# --------------------------------------------------------------------------------------------------
# small helpers used above and by the pipelines
# --------------------------------------------------------------------------------------------------
def one_hot(class_indices: np.ndarray, num_classes: int) -> np.ndarray:
    """float32 one-hot rows for integer class indices."""
    indices = np.asarray(class_indices, dtype=np.int64)
    out = np.zeros((indices.shape[0], num_classes), dtype=np.float32)
    out[np.arange(indices.shape[0]), indices] = 1.0
    return out


def _as_dataset(data: DataSet | MultiDataSet, source: str) -> DataSet:
    if isinstance(data, DataSet):
        return data
    try:
        return data.to_dataset()
    except DataError as exc:
        raise DataFileError(f"{source}: holds a MultiDataSet that is not a DataSet ({exc})") from exc


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise DataError(f"batch_size: expected a positive integer, got {batch_size!r}")


def _split_count(fraction_train: float, n: int) -> int:
    if not 0.0 <= float(fraction_train) <= 1.0:
        raise DataError(f"fraction_train: expected a number in [0, 1], got {fraction_train!r}")
    return int(round(float(fraction_train) * n))


def _split_order(seed: int | np.random.Generator | None, n: int) -> np.ndarray:
    return _rng(seed).permutation(n) if seed is not None else np.arange(n)
