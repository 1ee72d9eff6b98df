"""Calibration of predicted probabilities: reliability diagrams and probability histograms, per class.

A classifier is calibrated when, among the examples it gives probability ~0.8 for a class, ~80 % are
of that class. ``EvaluationCalibration`` bins each class's predicted probability into
``reliability_bins`` equal bins of [0, 1] and keeps, per bin, the count, the summed probability and
the count of actual members of the class: the reliability diagram (mean predicted probability vs
fraction of positives per non-empty bin) is what scikit-learn's ``calibration_curve(y == c, p[:, c])``
gives. It also keeps histograms (``histogram_bins``) of the predicted probabilities, over all examples
and over the examples of each class, and label and prediction counts. Every figure is a sum, so
partial results merge exactly.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from psrv.nn.errors import EvaluationError
from psrv.nn.eval_common import (
    VERSION,
    batch_arrays,
    check_rows,
    class_rows,
    load_json,
    safe_div,
)

__all__ = ["EvaluationCalibration", "ReliabilityDiagram"]

_SUMS = ("bin_counts", "bin_probability_sums", "bin_positives", "histogram", "label_histogram")


class ReliabilityDiagram:
    """One class's reliability diagram: for each non-empty bin, the mean predicted probability and the
    fraction of positives (as scikit-learn's ``calibration_curve`` returns them), and the bin counts."""

    def __init__(self, mean_predicted: np.ndarray, fraction_positive: np.ndarray, counts: np.ndarray,
                 edges: np.ndarray) -> None:
        self.mean_predicted = mean_predicted
        self.fraction_positive = fraction_positive
        self.counts = counts
        self.edges = edges

    def __repr__(self) -> str:
        return f"ReliabilityDiagram(bins={len(self.counts)}, examples={int(self.counts.sum())})"


def _positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int | np.integer) or value < 1:
        raise EvaluationError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def _bins(p: np.ndarray, bins: int) -> np.ndarray:
    """Bin index of each probability: [0, 1/b), [1/b, 2/b), ..., [(b-1)/b, 1]."""
    return np.clip((p * bins).astype(np.int64), 0, bins - 1)


class EvaluationCalibration:
    """Reliability diagram, probability histograms, label and prediction counts per class.

    Labels: one-hot ``(n, C)`` or class indices ``(n,)``; predictions: probabilities ``(n, C)``. A single
    sigmoid output (labels and probabilities ``(n,)`` or ``(n, 1)``) is evaluated as two classes
    (1 - p, p). Row masks ``(n,)``; time series ``(n, T, C)`` with an ``(n, T)`` mask.
    """

    def __init__(self, reliability_bins: int = 10, histogram_bins: int = 50) -> None:
        self.reliability_bins = _positive_int(reliability_bins, "reliability_bins")
        self.histogram_bins = _positive_int(histogram_bins, "histogram_bins")
        self.num_classes: int | None = None
        self._sums: dict[str, np.ndarray] = {}
        self.label_counts = np.zeros(0, np.int64)
        self.prediction_counts = np.zeros(0, np.int64)

    def _ensure(self, c: int) -> None:
        if self.num_classes is None:
            self.num_classes = c
            r, h = self.reliability_bins, self.histogram_bins
            self._sums = {
                "bin_counts": np.zeros((c, r), np.int64), "bin_probability_sums": np.zeros((c, r)),
                "bin_positives": np.zeros((c, r), np.int64), "histogram": np.zeros((c, h), np.int64),
                "label_histogram": np.zeros((c, h), np.int64),
            }
            self.label_counts = np.zeros(c, np.int64)
            self.prediction_counts = np.zeros(c, np.int64)
        elif c != self.num_classes:
            raise EvaluationError(f"expected {self.num_classes} classes (as before), got {c}")

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one batch of labels and predicted probabilities."""
        y, p, m = batch_arrays(labels, predictions, mask)
        check_rows(y, p)
        if p.ndim == 1 or (p.ndim == 2 and p.shape[1] == 1):  # one sigmoid output: two classes
            p = p.reshape(-1, 1).astype(np.float64)
            p = np.concatenate([1.0 - p, p], axis=1)
            y = y.reshape(-1)
        if p.ndim != 2:
            raise EvaluationError(f"predictions: expected probabilities (n, C), got shape {p.shape}")
        if p.size and (p.min() < 0 or p.max() > 1):
            raise EvaluationError("predictions: expected probabilities in [0, 1]")
        actual, p, num_classes = class_rows(y, p, m)
        self._ensure(num_classes)
        positive = actual[:, None] == np.arange(num_classes)[None, :]  # (n, C)
        bins = _bins(p, self.reliability_bins)
        hist = _bins(p, self.histogram_bins)
        s = self._sums
        for c in range(num_classes):
            s["bin_counts"][c] += np.bincount(bins[:, c], minlength=self.reliability_bins)
            s["bin_probability_sums"][c] += np.bincount(bins[:, c], weights=p[:, c],
                                                        minlength=self.reliability_bins)
            s["bin_positives"][c] += np.bincount(bins[positive[:, c], c], minlength=self.reliability_bins)
            s["histogram"][c] += np.bincount(hist[:, c], minlength=self.histogram_bins)
            s["label_histogram"][c] += np.bincount(hist[positive[:, c], c], minlength=self.histogram_bins)
        self.label_counts += np.bincount(actual, minlength=num_classes)
        self.prediction_counts += np.bincount(np.argmax(p, axis=1), minlength=num_classes)

    def merge(self, other: EvaluationCalibration) -> None:
        if not isinstance(other, EvaluationCalibration):
            raise EvaluationError(f"merge: expected an EvaluationCalibration, got {type(other).__name__}")
        if (other.reliability_bins, other.histogram_bins) != (self.reliability_bins, self.histogram_bins):
            raise EvaluationError("merge: reliability_bins or histogram_bins differ")
        if other.num_classes is None:
            return
        self._ensure(other.num_classes)
        for name in _SUMS:
            self._sums[name] += other._sums[name]
        self.label_counts += other.label_counts
        self.prediction_counts += other.prediction_counts

    # -- results -----------------------------------------------------------------------------
    @property
    def num_examples(self) -> int:
        return int(self.label_counts.sum())

    def _class(self, cls: int) -> int:
        if not self._sums:
            raise EvaluationError("no examples evaluated yet: call eval() (or merge) first")
        if not isinstance(cls, int | np.integer) or not 0 <= cls < (self.num_classes or 0):
            raise EvaluationError(f"cls: expected a class index in [0, {self.num_classes}), got {cls!r}")
        return int(cls)

    def reliability_diagram(self, cls: int) -> ReliabilityDiagram:
        """Class ``cls``'s reliability diagram (empty bins left out, as scikit-learn does)."""
        c = self._class(cls)
        counts = self._sums["bin_counts"][c]
        full = counts > 0
        return ReliabilityDiagram(
            mean_predicted=safe_div(self._sums["bin_probability_sums"][c], counts)[full],
            fraction_positive=safe_div(self._sums["bin_positives"][c], counts)[full],
            counts=counts.copy(),
            edges=np.linspace(0.0, 1.0, self.reliability_bins + 1),
        )

    def expected_calibration_error(self, cls: int) -> float:
        """Sum over bins of (bin share of examples) x |fraction of positives - mean probability|."""
        c = self._class(cls)
        counts = self._sums["bin_counts"][c].astype(np.float64)
        gap = np.abs(self._sums["bin_positives"][c] - self._sums["bin_probability_sums"][c])
        return float(gap.sum() / counts.sum()) if counts.sum() else 0.0

    def probability_histogram(self, cls: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(counts, edges) of the probabilities predicted for class ``cls`` (all classes when None)."""
        histogram = self._sums["histogram"]
        counts = histogram.sum(axis=0) if cls is None else histogram[self._class(cls)]
        return counts.copy(), np.linspace(0.0, 1.0, self.histogram_bins + 1)

    def label_probability_histogram(self, cls: int) -> tuple[np.ndarray, np.ndarray]:
        """(counts, edges) of the probability of class ``cls`` over the examples of that class."""
        return self._sums["label_histogram"][self._class(cls)].copy(), np.linspace(0.0, 1.0,
                                                                                  self.histogram_bins + 1)

    # -- persistence and text ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "EvaluationCalibration", "version": VERSION, "reliability_bins": self.reliability_bins,
            "histogram_bins": self.histogram_bins, "num_classes": self.num_classes,
            "sums": {name: v.tolist() for name, v in self._sums.items()},
            "label_counts": self.label_counts.tolist(), "prediction_counts": self.prediction_counts.tolist(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> EvaluationCalibration:
        data = load_json(text, "EvaluationCalibration")
        try:
            out = cls(data["reliability_bins"], data["histogram_bins"])
            if data["num_classes"] is not None:
                out._ensure(int(data["num_classes"]))
                for name in _SUMS:
                    value = np.asarray(data["sums"][name], dtype=out._sums[name].dtype)
                    if value.shape != out._sums[name].shape:
                        raise EvaluationError(f"EvaluationCalibration.from_json: {name} has shape "
                                              f"{value.shape}, expected {out._sums[name].shape}")
                    out._sums[name] = value
                classes = out.num_classes
                out.label_counts = np.asarray(data["label_counts"], np.int64).reshape(classes)
                out.prediction_counts = np.asarray(data["prediction_counts"], np.int64).reshape(classes)
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"EvaluationCalibration.from_json: malformed ({exc})") from exc
        return out

    def stats(self) -> str:
        if not self._sums:
            return "EvaluationCalibration: no examples evaluated"
        lines = [f"EvaluationCalibration: {self.num_examples} examples, {self.num_classes} classes, "
                 f"{self.reliability_bins} reliability bins",
                 "class  labels  predicted     ECE"]
        for c in range(self.num_classes or 0):
            lines.append(f"{c:>5}  {int(self.label_counts[c]):>6}  {int(self.prediction_counts[c]):>9}  "
                         f"{self.expected_calibration_error(c):>6.4f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"EvaluationCalibration(reliability_bins={self.reliability_bins}, "
                f"histogram_bins={self.histogram_bins}, num_classes={self.num_classes})")
