"""Normalizers: statistics fitted once on the training data, then applied to every batch.

A normalizer is saved with the network (``get_state()`` is plain JSON-able data;
``normalizer_from_state`` rebuilds it), so inference sees exactly the training transform.

Statistics are per feature: for 2-D ``(n, f)`` and image ``(n, ...)`` (4-D or more) arrays one value
per element of the trailing shape; for 3-D sequence batches ``(n, T, f)`` one value per ``f``, over
the real steps only when a mask ``(n, T)`` is given (padding stays zero after a transform).
Fitting streams over an iterable of DataSets (Chan's parallel mean/variance), so a data set that
does not fit in memory can be fitted batch by batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import numpy as np
from psrv.nn.data import DataSet
from psrv.nn.errors import NormalizerError

__all__ = ["ImageScaler", "MinMax", "Normalizer", "Standardize", "normalizer_from_state"]

_STATE_VERSION = 1


def _rows(array: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The rows statistics are taken over: (rows, *feature_shape) as float64."""
    data = np.asarray(array, dtype=np.float64)
    if data.ndim == 1:
        return data.reshape(-1, 1)
    if data.ndim == 3:
        flat = data.reshape(-1, data.shape[2])
        if mask is not None and mask.ndim == 2 and mask.shape == data.shape[:2]:
            return flat[np.asarray(mask).reshape(-1) != 0]
        return flat
    return data


def _check_finite(rows: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(rows)):
        raise NormalizerError(f"{what}: expected finite values to fit on, found NaN or infinity")


def _iter_datasets(data: DataSet | Iterable[DataSet]) -> Iterable[DataSet]:
    if isinstance(data, DataSet):
        return [data]
    return data


def _apply(array: np.ndarray, mask: np.ndarray | None, fn) -> np.ndarray:
    """Apply ``fn`` in float (keeping float32 as float32), keep sequence padding at zero."""
    dtype = array.dtype if array.dtype.kind == "f" else np.float32
    squeeze = array.ndim == 1
    data = array.reshape(-1, 1) if squeeze else array
    out = np.asarray(fn(data.astype(np.float64)), dtype=dtype)
    if out.ndim == 3 and mask is not None and mask.ndim == 2 and mask.shape == out.shape[:2]:
        out = out * (np.asarray(mask) != 0)[:, :, None].astype(dtype)
    return out.reshape(array.shape) if squeeze else out


class _Stats:
    """Running count/mean/M2/min/max of one array slot; mergeable."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None
        self.minimum: np.ndarray | None = None
        self.maximum: np.ndarray | None = None

    def add(self, rows: np.ndarray, what: str) -> None:
        if rows.shape[0] == 0:
            return
        _check_finite(rows, what)
        if self.mean is not None and rows.shape[1:] != self.mean.shape:
            raise NormalizerError(
                f"{what}: expected feature shape {self.mean.shape} (as in earlier batches), "
                f"got {rows.shape[1:]}"
            )
        n = rows.shape[0]
        mean = rows.mean(axis=0)
        m2 = ((rows - mean) ** 2).sum(axis=0)
        if self.mean is None:
            self.count, self.mean, self.m2 = n, mean, m2
            self.minimum, self.maximum = rows.min(axis=0), rows.max(axis=0)
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count = total
        self.minimum = np.minimum(self.minimum, rows.min(axis=0))
        self.maximum = np.maximum(self.maximum, rows.max(axis=0))

    @property
    def std(self) -> np.ndarray:
        assert self.m2 is not None
        return np.sqrt(self.m2 / self.count)


def _to_list(array: np.ndarray | None) -> Any:
    return None if array is None else np.asarray(array, dtype=np.float64).tolist()


def _from_list(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value, dtype=np.float64)


class Normalizer(ABC):
    """fit once, then transform every DataSet; ``revert_*`` undoes the transform."""

    fit_labels: bool = False

    @abstractmethod
    def fit(self, data: DataSet | Iterable[DataSet]) -> Normalizer: ...

    @property
    @abstractmethod
    def is_fitted(self) -> bool: ...

    @abstractmethod
    def _forward(self, data: np.ndarray, labels: bool) -> np.ndarray: ...

    @abstractmethod
    def _backward(self, data: np.ndarray, labels: bool) -> np.ndarray: ...

    @abstractmethod
    def get_state(self) -> dict[str, Any]: ...

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise NormalizerError(
                f"{type(self).__name__} used before fit(): fit it on the training data first"
            )

    def transform_features(self, features: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        self._require_fitted()
        return _apply(np.asarray(features), mask, lambda x: self._forward(x, labels=False))

    def revert_features(self, features: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        self._require_fitted()
        return _apply(np.asarray(features), mask, lambda x: self._backward(x, labels=False))

    def transform_labels(self, labels: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        self._require_fitted()
        if not self.fit_labels:
            return np.asarray(labels)
        return _apply(np.asarray(labels), mask, lambda x: self._forward(x, labels=True))

    def revert_labels(self, labels: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Map network outputs back to label units (regression with ``fit_labels=True``)."""
        self._require_fitted()
        if not self.fit_labels:
            return np.asarray(labels)
        return _apply(np.asarray(labels), mask, lambda x: self._backward(x, labels=True))

    def transform(self, dataset: DataSet) -> DataSet:
        """A new DataSet with normalized features (and labels when ``fit_labels``)."""
        if not isinstance(dataset, DataSet):
            raise NormalizerError(f"transform: expected a DataSet, got {type(dataset).__name__}")
        return DataSet(
            self.transform_features(dataset.features, dataset.features_mask),
            self.transform_labels(dataset.labels, dataset.labels_mask),
            dataset.features_mask,
            dataset.labels_mask,
        )

    def revert(self, dataset: DataSet) -> DataSet:
        return DataSet(
            self.revert_features(dataset.features, dataset.features_mask),
            self.revert_labels(dataset.labels, dataset.labels_mask),
            dataset.features_mask,
            dataset.labels_mask,
        )

    def __call__(self, dataset: DataSet) -> DataSet:
        return self.transform(dataset)


class _FittedNormalizer(Normalizer):
    """Shared fitting of the statistics-based normalizers."""

    def __init__(self, fit_labels: bool = False) -> None:
        self.fit_labels = bool(fit_labels)

    def fit(self, data: DataSet | Iterable[DataSet]) -> Normalizer:
        """Fit on one DataSet or stream over many; a second fit starts afresh."""
        features, labels = _Stats(), _Stats()
        seen = 0
        for i, dataset in enumerate(_iter_datasets(data)):
            if not isinstance(dataset, DataSet):
                raise NormalizerError(f"fit: item {i} is a {type(dataset).__name__}, expected a DataSet")
            features.add(_rows(dataset.features, dataset.features_mask), "features")
            if self.fit_labels:
                labels.add(_rows(dataset.labels, dataset.labels_mask), "labels")
            seen += dataset.num_examples
        if features.count == 0:
            raise NormalizerError(f"fit: expected at least one example, got {seen} usable examples")
        self._set(features, labels if self.fit_labels else None)
        return self

    @abstractmethod
    def _set(self, features: _Stats, labels: _Stats | None) -> None: ...


class Standardize(_FittedNormalizer):
    """Zero mean, unit variance per feature (a constant feature is only centred)."""

    def __init__(self, fit_labels: bool = False, epsilon: float = 1e-8) -> None:
        super().__init__(fit_labels)
        self.epsilon = float(epsilon)
        self.feature_mean: np.ndarray | None = None
        self.feature_std: np.ndarray | None = None
        self.label_mean: np.ndarray | None = None
        self.label_std: np.ndarray | None = None

    @property
    def is_fitted(self) -> bool:
        return self.feature_mean is not None

    def _set(self, features: _Stats, labels: _Stats | None) -> None:
        self.feature_mean, self.feature_std = features.mean, self._safe(features.std)
        if labels is not None and labels.count:
            self.label_mean, self.label_std = labels.mean, self._safe(labels.std)

    def _safe(self, std: np.ndarray) -> np.ndarray:
        return np.where(std < self.epsilon, 1.0, std)

    def _pick(self, labels: bool) -> tuple[np.ndarray, np.ndarray]:
        mean, std = (self.label_mean, self.label_std) if labels else (self.feature_mean, self.feature_std)
        if mean is None or std is None:
            raise NormalizerError("Standardize: label statistics were not fitted (fit_labels=False at fit)")
        return mean, std

    def _forward(self, data: np.ndarray, labels: bool) -> np.ndarray:
        mean, std = self._pick(labels)
        _check_shape(data, mean, "labels" if labels else "features")
        return (data - mean) / std

    def _backward(self, data: np.ndarray, labels: bool) -> np.ndarray:
        mean, std = self._pick(labels)
        _check_shape(data, mean, "labels" if labels else "features")
        return data * std + mean

    def get_state(self) -> dict[str, Any]:
        self._require_fitted()
        return {
            "type": "Standardize",
            "version": _STATE_VERSION,
            "fit_labels": self.fit_labels,
            "epsilon": self.epsilon,
            "feature_mean": _to_list(self.feature_mean),
            "feature_std": _to_list(self.feature_std),
            "label_mean": _to_list(self.label_mean),
            "label_std": _to_list(self.label_std),
        }

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> Standardize:
        out = cls(fit_labels=state["fit_labels"], epsilon=state["epsilon"])
        out.feature_mean = _from_list(state["feature_mean"])
        out.feature_std = _from_list(state["feature_std"])
        out.label_mean, out.label_std = _from_list(state["label_mean"]), _from_list(state["label_std"])
        return out

    def __repr__(self) -> str:
        return f"Standardize(fit_labels={self.fit_labels}, fitted={self.is_fitted})"


class MinMax(_FittedNormalizer):
    """Scale each feature linearly so the fitted minimum/maximum map to ``min_range``/``max_range``."""

    def __init__(self, min_range: float = 0.0, max_range: float = 1.0, fit_labels: bool = False) -> None:
        super().__init__(fit_labels)
        if not max_range > min_range:
            raise NormalizerError(f"MinMax: expected min_range < max_range, got {min_range} and {max_range}")
        self.min_range, self.max_range = float(min_range), float(max_range)
        self.feature_min: np.ndarray | None = None
        self.feature_max: np.ndarray | None = None
        self.label_min: np.ndarray | None = None
        self.label_max: np.ndarray | None = None

    @property
    def is_fitted(self) -> bool:
        return self.feature_min is not None

    def _set(self, features: _Stats, labels: _Stats | None) -> None:
        self.feature_min, self.feature_max = features.minimum, features.maximum
        if labels is not None and labels.count:
            self.label_min, self.label_max = labels.minimum, labels.maximum

    def _pick(self, labels: bool) -> tuple[np.ndarray, np.ndarray]:
        low, high = (self.label_min, self.label_max) if labels else (self.feature_min, self.feature_max)
        if low is None or high is None:
            raise NormalizerError("MinMax: label statistics were not fitted (fit_labels=False at fit)")
        span = high - low
        return low, np.where(span == 0, 1.0, span)

    def _forward(self, data: np.ndarray, labels: bool) -> np.ndarray:
        low, span = self._pick(labels)
        _check_shape(data, low, "labels" if labels else "features")
        return (data - low) / span * (self.max_range - self.min_range) + self.min_range

    def _backward(self, data: np.ndarray, labels: bool) -> np.ndarray:
        low, span = self._pick(labels)
        _check_shape(data, low, "labels" if labels else "features")
        return (data - self.min_range) / (self.max_range - self.min_range) * span + low

    def get_state(self) -> dict[str, Any]:
        self._require_fitted()
        return {
            "type": "MinMax",
            "version": _STATE_VERSION,
            "fit_labels": self.fit_labels,
            "min_range": self.min_range,
            "max_range": self.max_range,
            "feature_min": _to_list(self.feature_min),
            "feature_max": _to_list(self.feature_max),
            "label_min": _to_list(self.label_min),
            "label_max": _to_list(self.label_max),
        }

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> MinMax:
        out = cls(state["min_range"], state["max_range"], fit_labels=state["fit_labels"])
        out.feature_min, out.feature_max = _from_list(state["feature_min"]), _from_list(state["feature_max"])
        out.label_min, out.label_max = _from_list(state["label_min"]), _from_list(state["label_max"])
        return out

    def __repr__(self) -> str:
        return f"MinMax(min_range={self.min_range}, max_range={self.max_range}, fitted={self.is_fitted})"


class ImageScaler(Normalizer):
    """Pixels ``[0, max_pixel]`` (default 0-255) to ``[min_range, max_range]``; nothing to fit."""

    def __init__(self, min_range: float = 0.0, max_range: float = 1.0, max_pixel: float = 255.0) -> None:
        if not max_range > min_range or not max_pixel > 0:
            raise NormalizerError(
                f"ImageScaler: expected min_range < max_range and max_pixel > 0, got {min_range}, "
                f"{max_range}, {max_pixel}"
            )
        self.min_range, self.max_range, self.max_pixel = float(min_range), float(max_range), float(max_pixel)
        self.fit_labels = False

    @property
    def is_fitted(self) -> bool:
        return True

    def fit(self, data: DataSet | Iterable[DataSet]) -> ImageScaler:
        """Nothing to learn: the pixel range is fixed."""
        return self

    def _forward(self, data: np.ndarray, labels: bool) -> np.ndarray:
        return data / self.max_pixel * (self.max_range - self.min_range) + self.min_range

    def _backward(self, data: np.ndarray, labels: bool) -> np.ndarray:
        return (data - self.min_range) / (self.max_range - self.min_range) * self.max_pixel

    def get_state(self) -> dict[str, Any]:
        return {
            "type": "ImageScaler",
            "version": _STATE_VERSION,
            "min_range": self.min_range,
            "max_range": self.max_range,
            "max_pixel": self.max_pixel,
        }

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> ImageScaler:
        return cls(state["min_range"], state["max_range"], state["max_pixel"])

    def __repr__(self) -> str:
        return (
            f"ImageScaler(min_range={self.min_range}, max_range={self.max_range}, max_pixel={self.max_pixel})"
        )


def _check_shape(data: np.ndarray, stat: np.ndarray, what: str) -> None:
    tail = data.shape[-stat.ndim :] if stat.ndim else ()
    if tuple(tail) != stat.shape:
        raise NormalizerError(
            f"{what}: expected trailing shape {stat.shape} (as fitted), got array of shape {data.shape}"
        )


_TYPES: dict[str, Any] = {"Standardize": Standardize, "MinMax": MinMax, "ImageScaler": ImageScaler}


def normalizer_from_state(state: dict[str, Any]) -> Normalizer:
    """Rebuild a normalizer from ``get_state()`` output."""
    if not isinstance(state, dict) or "type" not in state:
        raise NormalizerError(f"normalizer state: expected a dict with a 'type' key, got {state!r:.200}")
    kind = state["type"]
    if kind not in _TYPES:
        raise NormalizerError(f"normalizer state: unknown type {kind!r}; known: {sorted(_TYPES)}")
    version = state.get("version")
    if version != _STATE_VERSION:
        raise NormalizerError(f"normalizer state: unsupported version {version!r}; expected {_STATE_VERSION}")
    try:
        return _TYPES[kind]._from_state(state)
    except KeyError as exc:
        raise NormalizerError(f"normalizer state of type {kind}: missing key {exc}") from exc
