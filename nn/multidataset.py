"""MultiDataSet: several input arrays and several label arrays, DL4J's MultiDataSet."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from psrv.nn.data_common import (
    ExampleRows,
    as_array,
    check_count,
    check_mask,
    merge_slot,
    same_arrays,
    take,
)
from psrv.nn.data_file import encode_arrays, read_file_bytes, write_file_bytes
from psrv.nn.errors import DataError, DataFileError

if TYPE_CHECKING:
    from psrv.nn.data import DataSet

__all__ = ["MultiDataSet"]


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


class MultiDataSet(ExampleRows):
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
        from psrv.nn.data import DataSet  # data.py imports this module: import it when called
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

    def to_bytes(self) -> bytes:
        return encode_arrays("MultiDataSet", self._named_arrays())

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> MultiDataSet:
        from psrv.nn.data import DataSet, read_data_bytes  # data.py imports this module

        data = read_data_bytes(blob, source)
        return data.to_multi() if isinstance(data, DataSet) else data

    def save(self, path: str | os.PathLike[str]) -> None:
        write_file_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MultiDataSet:
        return cls.from_bytes(read_file_bytes(path), os.fspath(path))

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
