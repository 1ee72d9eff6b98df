"""Evaluations: classification, ROC (binary and one-vs-all) and regression metrics.

Every evaluation accumulates sufficient statistics batch by batch (``eval``), so partial results
from many Spark tasks combine with ``merge`` into exactly what evaluating the union would give, and
each round-trips through JSON (``to_json`` / ``from_json``; ``evaluation_from_json`` for any kind).

Shapes accepted by ``eval``:

- classification labels: one-hot ``(n, C)`` or class indices ``(n,)``; predictions: probabilities
  ``(n, C)`` (or class indices ``(n,)``, top-1 only); sequences ``(n, T, C)`` with a mask ``(n, T)``.
- ROC labels: ``(n,)``/``(n, 1)`` of 0/1 or one-hot ``(n, 2)``; predictions: probability of the
  positive class ``(n,)``/``(n, 1)`` or ``(n, 2)`` (column 1 is used).
- regression: ``(n, k)`` or ``(n,)``; masks ``(n,)``, ``(n, k)`` (per column) or ``(n, T)`` (sequences).

Masked rows (mask 0) are skipped. Undefined per-class ratios (no predictions of a class, say) count
as 0, as scikit-learn's ``zero_division=0``; macro averages run over all classes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from psrv.nn.errors import EvaluationError

__all__ = ["ROC", "Evaluation", "ROCMultiClass", "RegressionEvaluation", "evaluation_from_json"]

_VERSION = 1


# --------------------------------------------------------------------------------------------------
# input checking shared by the evaluations
# --------------------------------------------------------------------------------------------------
def _array(value: Any, what: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything numpy refuses is bad input
        raise EvaluationError(f"{what}: expected a numeric array, got {type(value).__name__}") from exc
    if array.dtype.kind not in "biuf":
        raise EvaluationError(f"{what}: expected a numeric array, got dtype {array.dtype}")
    if array.ndim == 0:
        raise EvaluationError(f"{what}: expected an array with one row per example, got a scalar")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise EvaluationError(f"{what}: expected finite values, found NaN or infinity")
    return array


def _flatten_time(
    labels: np.ndarray, predictions: np.ndarray, mask: np.ndarray | None, *, sequence_ndim: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sequence batches (n, T, ...) become (n*T, ...) rows; an (n, T) mask becomes per-row."""
    if predictions.ndim != sequence_ndim:
        return labels, predictions, mask
    n, steps = predictions.shape[:2]
    if labels.shape[:2] != (n, steps):
        raise EvaluationError(
            f"labels: expected a sequence batch of shape ({n}, {steps}, ...) like the predictions, "
            f"got {labels.shape}"
        )
    if mask is not None and mask.shape != (n, steps):
        raise EvaluationError(f"mask: expected shape ({n}, {steps}) for a sequence batch, got {mask.shape}")
    labels = labels.reshape(n * steps, *labels.shape[2:])
    predictions = predictions.reshape(n * steps, *predictions.shape[2:])
    return labels, predictions, None if mask is None else mask.reshape(-1)


def _row_mask(mask: Any, n: int) -> np.ndarray | None:
    if mask is None:
        return None
    m = _array(mask, "mask")
    if m.ndim == 2 and m.shape[1] == 1:
        m = m[:, 0]
    if m.shape != (n,):
        raise EvaluationError(f"mask: expected shape ({n},) (one value per example), got {m.shape}")
    return m != 0


def _check_rows(labels: np.ndarray, predictions: np.ndarray) -> None:
    if labels.shape[0] != predictions.shape[0]:
        raise EvaluationError(
            f"labels and predictions: expected the same number of rows, got {labels.shape[0]} and "
            f"{predictions.shape[0]}"
        )


def _load(text: str | bytes | dict[str, Any], kind: str) -> dict[str, Any]:
    try:
        data = text if isinstance(text, dict) else json.loads(text)
    except ValueError as exc:
        raise EvaluationError(f"{kind}.from_json: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("type") != kind:
        got = data.get("type") if isinstance(data, dict) else type(data).__name__
        raise EvaluationError(f"{kind}.from_json: expected a JSON object of type {kind!r}, got {got!r}")
    if data.get("version") != _VERSION:
        raise EvaluationError(f"{kind}.from_json: unsupported version {data.get('version')!r}")
    return data


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den != 0)


def _fmt(value: float) -> str:
    return f"{value:.4f}" if np.isfinite(value) else "n/a"


# --------------------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------------------
class Evaluation:
    """Classification metrics from a confusion matrix (rows: actual class, columns: predicted)."""

    def __init__(
        self, num_classes: int | None = None, top_n: int = 1, class_names: list[str] | None = None
    ) -> None:
        if num_classes is not None and (not isinstance(num_classes, int | np.integer) or num_classes < 1):
            raise EvaluationError(f"num_classes: expected a positive integer or None, got {num_classes!r}")
        if not isinstance(top_n, int | np.integer) or top_n < 1:
            raise EvaluationError(f"top_n: expected a positive integer, got {top_n!r}")
        if class_names is not None and num_classes is not None and len(class_names) != num_classes:
            raise EvaluationError(f"class_names: expected {num_classes} names, got {len(class_names)}")
        if class_names is not None and num_classes is None:
            num_classes = len(class_names)
        self.num_classes: int | None = None if num_classes is None else int(num_classes)
        self.top_n = int(top_n)
        self.class_names = None if class_names is None else [str(c) for c in class_names]
        self._confusion: np.ndarray | None = (
            None if self.num_classes is None else np.zeros((self.num_classes, self.num_classes), np.int64)
        )
        self.top_n_correct = 0

    # -- accumulating ------------------------------------------------------------------------
    def _ensure(self, num_classes: int) -> np.ndarray:
        if self._confusion is None:
            self.num_classes = num_classes
            self._confusion = np.zeros((num_classes, num_classes), np.int64)
        elif num_classes != self.num_classes:
            raise EvaluationError(f"expected {self.num_classes} classes (as before), got {num_classes}")
        return self._confusion

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one batch: labels one-hot or class indices; predictions probabilities or indices."""
        y = _array(labels, "labels")
        p = _array(predictions, "predictions")
        m = None if mask is None else _array(mask, "mask")
        y, p, m = _flatten_time(y, p, m, sequence_ndim=3)
        if p.ndim == 2 and y.ndim == 2 and p.shape[1] != y.shape[1]:
            raise EvaluationError(
                f"labels and predictions: expected the same number of classes, got labels {y.shape} and "
                f"predictions {p.shape}"
            )
        _check_rows(y, p)
        keep = _row_mask(m, y.shape[0])
        if p.ndim == 2:
            num_classes = p.shape[1]
        elif y.ndim == 2:
            num_classes = y.shape[1]
        else:
            num_classes = self.num_classes
            if num_classes is None:
                raise EvaluationError(
                    "num_classes: unknown; give Evaluation(num_classes=...) when both labels and "
                    "predictions are class indices"
                )
        if y.ndim > 2 or p.ndim > 2:
            raise EvaluationError(
                f"labels/predictions: expected (n,) or (n, classes) (or (n, T, classes)), got {y.shape} "
                f"and {p.shape}"
            )
        actual = self._indices(y, num_classes, "labels")
        predicted = np.argmax(p, axis=1) if p.ndim == 2 else self._indices(p, num_classes, "predictions")
        if p.ndim == 1 and self.top_n > 1:
            raise EvaluationError(f"top_n={self.top_n} needs class probabilities (n, C), got class indices")
        confusion = self._ensure(num_classes)
        if keep is not None:
            actual, predicted = actual[keep], predicted[keep]
            p = p[keep]
        if actual.size == 0:
            return
        np.add.at(confusion, (actual, predicted), 1)
        if p.ndim == 2:
            true_scores = p[np.arange(p.shape[0]), actual]
            rank = (p > true_scores[:, None]).sum(axis=1)
            self.top_n_correct += int((rank < self.top_n).sum())
        else:
            self.top_n_correct += int((actual == predicted).sum())

    @staticmethod
    def _indices(values: np.ndarray, num_classes: int, what: str) -> np.ndarray:
        if values.ndim == 2:
            return np.argmax(values, axis=1)
        if values.dtype.kind == "f" and not np.all(values == np.round(values)):
            raise EvaluationError(f"{what}: expected integer class indices, got fractional values")
        indices = values.astype(np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= num_classes):
            raise EvaluationError(
                f"{what}: expected class indices in [0, {num_classes}), got range "
                f"[{int(indices.min())}, {int(indices.max())}]"
            )
        return indices

    def merge(self, other: Evaluation) -> None:
        """Add another evaluation's counts into this one (in place)."""
        if not isinstance(other, Evaluation):
            raise EvaluationError(f"merge: expected an Evaluation, got {type(other).__name__}")
        if other.top_n != self.top_n:
            raise EvaluationError(f"merge: top_n differs ({self.top_n} vs {other.top_n})")
        if other._confusion is None:
            return
        self._ensure(int(other.num_classes))  # raises on a class-count mismatch
        self._confusion += other._confusion
        self.top_n_correct += other.top_n_correct
        if self.class_names is None and other.class_names is not None:
            self.class_names = list(other.class_names)

    # -- metrics -----------------------------------------------------------------------------
    def confusion_matrix(self) -> np.ndarray:
        """(C, C) int64 counts; rows: actual class, columns: predicted class (a copy)."""
        if self._confusion is None:
            return np.zeros((0, 0), np.int64)
        return self._confusion.copy()

    @property
    def num_examples(self) -> int:
        return 0 if self._confusion is None else int(self._confusion.sum())

    def _counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._confusion is None or self.num_examples == 0:
            raise EvaluationError("no examples evaluated yet: call eval() (or merge) first")
        cm = self._confusion
        tp = np.diag(cm).astype(np.float64)
        return tp, cm.sum(axis=0) - tp, cm.sum(axis=1) - tp

    def _class(self, cls: int) -> int:
        if not isinstance(cls, int | np.integer) or not 0 <= cls < (self.num_classes or 0):
            raise EvaluationError(f"cls: expected a class index in [0, {self.num_classes}), got {cls!r}")
        return int(cls)

    def accuracy(self) -> float:
        tp, _, _ = self._counts()
        return float(tp.sum() / self.num_examples)

    def top_n_accuracy(self) -> float:
        self._counts()
        return self.top_n_correct / self.num_examples

    def _per_class(self, metric: str) -> np.ndarray:
        tp, fp, fn = self._counts()
        precision = _safe_div(tp, tp + fp)
        recall = _safe_div(tp, tp + fn)
        if metric == "precision":
            return precision
        if metric == "recall":
            return recall
        return _safe_div(2 * precision * recall, precision + recall)

    def _metric(self, metric: str, cls: int | None, average: str) -> float:
        if cls is not None:
            self._counts()
            return float(self._per_class(metric)[self._class(cls)])
        if average == "macro":
            return float(self._per_class(metric).mean())
        if average == "micro":
            tp, fp, fn = (v.sum() for v in self._counts())
            precision = tp / (tp + fp) if tp + fp else 0.0
            recall = tp / (tp + fn) if tp + fn else 0.0
            if metric == "precision":
                return float(precision)
            if metric == "recall":
                return float(recall)
            return float(2 * precision * recall / (precision + recall)) if precision + recall else 0.0
        raise EvaluationError(f"average: expected 'macro' or 'micro', got {average!r}")

    def precision(self, cls: int | None = None, average: str = "macro") -> float:
        """Precision of one class, or averaged over all classes (``macro`` or ``micro``)."""
        return self._metric("precision", cls, average)

    def recall(self, cls: int | None = None, average: str = "macro") -> float:
        return self._metric("recall", cls, average)

    def f1(self, cls: int | None = None, average: str = "macro") -> float:
        """F1 of one class, or the mean of the per-class F1 scores (``macro``) or the micro F1."""
        return self._metric("f1", cls, average)

    def false_positive_rate(self, cls: int) -> float:
        tp, fp, fn = self._counts()
        c = self._class(cls)
        negatives = self.num_examples - (tp[c] + fn[c])
        return float(fp[c] / negatives) if negatives else 0.0

    def class_count(self, cls: int) -> int:
        """How many examples of class ``cls`` were seen."""
        return int(self.confusion_matrix()[self._class(cls)].sum())

    # -- persistence and text ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "Evaluation",
            "version": _VERSION,
            "num_classes": self.num_classes,
            "top_n": self.top_n,
            "class_names": self.class_names,
            "confusion": None if self._confusion is None else self._confusion.tolist(),
            "top_n_correct": self.top_n_correct,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> Evaluation:
        data = _load(text, "Evaluation")
        try:
            out = cls(data["num_classes"], data["top_n"], data["class_names"])
            if data["confusion"] is not None:
                confusion = np.asarray(data["confusion"], dtype=np.int64)
                if confusion.shape != (out.num_classes, out.num_classes):
                    raise EvaluationError(
                        f"Evaluation.from_json: confusion matrix of shape {confusion.shape} does not match "
                        f"{out.num_classes} classes"
                    )
                out._confusion = confusion
            out.top_n_correct = int(data["top_n_correct"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"Evaluation.from_json: malformed ({exc})") from exc
        return out

    def _name(self, c: int) -> str:
        return self.class_names[c] if self.class_names else str(c)

    def stats(self) -> str:
        """A readable summary: overall metrics, a per-class table and the confusion matrix."""
        if self.num_examples == 0:
            return "Evaluation: no examples evaluated"
        lines = [
            f"Examples:            {self.num_examples}  (classes: {self.num_classes})",
            f"Accuracy:            {_fmt(self.accuracy())}",
            f"Precision (macro):   {_fmt(self.precision())}",
            f"Recall (macro):      {_fmt(self.recall())}",
            f"F1 (macro):          {_fmt(self.f1())}",
        ]
        if self.top_n > 1:
            lines.append(f"Top-{self.top_n} accuracy:      {_fmt(self.top_n_accuracy())}")
        lines.append("")
        width = max(8, *(len(self._name(c)) for c in range(self.num_classes or 0)))
        lines.append(f"{'class':>{width}}  {'count':>7}  {'precision':>9}  {'recall':>7}  {'f1':>7}")
        precision, recall, f1 = (self._per_class(m) for m in ("precision", "recall", "f1"))
        cm = self._confusion
        assert cm is not None
        for c in range(cm.shape[0]):
            lines.append(
                f"{self._name(c):>{width}}  {int(cm[c].sum()):>7}  {precision[c]:>9.4f}  {recall[c]:>7.4f}  "
                f"{f1[c]:>7.4f}"
            )
        lines.append("")
        lines.append("Confusion matrix (rows: actual, columns: predicted)")
        cell = max(5, len(str(int(cm.max()))) + 1)
        lines.append(
            " " * (width + 1) + "".join(f"{self._name(c)[: cell - 1]:>{cell}}" for c in range(cm.shape[0]))
        )
        for c in range(cm.shape[0]):
            lines.append(f"{self._name(c):>{width}} " + "".join(f"{v:>{cell}}" for v in cm[c]))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Evaluation(num_classes={self.num_classes}, top_n={self.top_n}, examples={self.num_examples})"


# --------------------------------------------------------------------------------------------------
# ROC
# --------------------------------------------------------------------------------------------------
def _binary_inputs(labels: Any, predictions: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
    y = _array(labels, "labels")
    p = _array(predictions, "predictions")
    m = None if mask is None else _array(mask, "mask")
    y, p, m = _flatten_time(y, p, m, sequence_ndim=3)
    _check_rows(y, p)

    def column(values: np.ndarray, what: str) -> np.ndarray:
        if values.ndim == 1:
            return values
        if values.ndim == 2 and values.shape[1] == 1:
            return values[:, 0]
        if values.ndim == 2 and values.shape[1] == 2:
            return values[:, 1]
        raise EvaluationError(
            f"{what}: expected shape (n,), (n, 1) or (n, 2) for a binary ROC, got {values.shape}"
        )

    y, p = column(y, "labels"), column(p, "predictions")
    if y.size and not np.all((y == 0) | (y == 1)):
        raise EvaluationError("labels: expected binary labels (0 or 1) for a ROC")
    keep = _row_mask(m, y.shape[0])
    if keep is not None:
        y, p = y[keep], p[keep]
    return y.astype(bool), p.astype(np.float64)


class ROC:
    """Binary ROC. ``threshold_steps=0``: exact (keeps every score); N > 0: N+1 fixed thresholds."""

    def __init__(self, threshold_steps: int = 0) -> None:
        if not isinstance(threshold_steps, int | np.integer) or threshold_steps < 0:
            raise EvaluationError(f"threshold_steps: expected an integer >= 0, got {threshold_steps!r}")
        self.threshold_steps = int(threshold_steps)
        self._scores: list[np.ndarray] = []
        self._positives: list[np.ndarray] = []
        if self.threshold_steps:
            self._pos_hist = np.zeros(self.threshold_steps + 1, np.int64)
            self._neg_hist = np.zeros(self.threshold_steps + 1, np.int64)

    @property
    def exact(self) -> bool:
        return self.threshold_steps == 0

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one batch of binary labels and positive-class probabilities."""
        positives, scores = _binary_inputs(labels, predictions, mask)
        self._add(positives, scores)

    def _add(self, positives: np.ndarray, scores: np.ndarray) -> None:
        if scores.size == 0:
            return
        if self.exact:
            self._scores.append(scores.copy())
            self._positives.append(positives.copy())
            return
        thresholds = np.arange(self.threshold_steps + 1) / self.threshold_steps
        bins = np.clip(np.searchsorted(thresholds, scores, side="right") - 1, 0, self.threshold_steps)
        self._pos_hist += np.bincount(bins[positives], minlength=self.threshold_steps + 1)
        self._neg_hist += np.bincount(bins[~positives], minlength=self.threshold_steps + 1)

    def _all(self) -> tuple[np.ndarray, np.ndarray]:
        if len(self._scores) > 1:
            self._scores = [np.concatenate(self._scores)]
            self._positives = [np.concatenate(self._positives)]
        if not self._scores:
            return np.zeros(0, bool), np.zeros(0)
        return self._positives[0], self._scores[0]

    @property
    def num_positives(self) -> int:
        return int(self._all()[0].sum()) if self.exact else int(self._pos_hist.sum())

    @property
    def num_negatives(self) -> int:
        return int((~self._all()[0]).sum()) if self.exact else int(self._neg_hist.sum())

    def merge(self, other: ROC) -> None:
        if not isinstance(other, ROC):
            raise EvaluationError(f"merge: expected a ROC, got {type(other).__name__}")
        if other.threshold_steps != self.threshold_steps:
            raise EvaluationError(
                f"merge: threshold_steps differ ({self.threshold_steps} vs {other.threshold_steps})"
            )
        if self.exact:
            positives, scores = other._all()
            self._add(positives, scores)
        else:
            self._pos_hist += other._pos_hist
            self._neg_hist += other._neg_hist

    def _cumulative(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(true positives, false positives, thresholds) for decreasing thresholds, (0, 0) first."""
        if self.num_positives == 0 or self.num_negatives == 0:
            raise EvaluationError(
                f"ROC undefined: need both classes, got {self.num_positives} positive and "
                f"{self.num_negatives} negative examples"
            )
        if self.exact:
            positives, scores = self._all()
            order = np.argsort(-scores, kind="mergesort")
            scores, positives = scores[order], positives[order]
            last_of_each = np.r_[np.nonzero(np.diff(scores))[0], scores.size - 1]
            tp = np.cumsum(positives)[last_of_each]
            fp = (last_of_each + 1) - tp
            thresholds = scores[last_of_each]
        else:
            tp = np.cumsum(self._pos_hist[::-1])
            fp = np.cumsum(self._neg_hist[::-1])
            thresholds = np.arange(self.threshold_steps, -1, -1) / self.threshold_steps
        return np.r_[0, tp].astype(np.float64), np.r_[0, fp].astype(np.float64), np.r_[np.inf, thresholds]

    def roc_curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(false positive rate, true positive rate, threshold) points, from (0, 0) to (1, 1)."""
        tp, fp, thresholds = self._cumulative()
        return fp / fp[-1], tp / tp[-1], thresholds

    def auc(self) -> float:
        """Area under the ROC curve (trapezoids; exact with ``threshold_steps=0``)."""
        fpr, tpr, _ = self.roc_curve()
        return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))

    def average_precision(self) -> float:
        """Area under the precision-recall curve as a step sum (scikit-learn's average precision)."""
        tp, fp, _ = self._cumulative()
        recall = tp / tp[-1]
        precision = _safe_div(tp, tp + fp)
        return float(np.sum(np.diff(recall) * precision[1:]))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": "ROC", "version": _VERSION, "threshold_steps": self.threshold_steps}
        if self.exact:
            positives, scores = self._all()
            data["scores"] = scores.tolist()
            data["positives"] = positives.astype(int).tolist()
        else:
            data["positive_counts"] = self._pos_hist.tolist()
            data["negative_counts"] = self._neg_hist.tolist()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> ROC:
        data = _load(text, "ROC")
        try:
            out = cls(data["threshold_steps"])
            if out.exact:
                scores = np.asarray(data["scores"], dtype=np.float64)
                positives = np.asarray(data["positives"], dtype=np.int64).astype(bool)
                if scores.shape != positives.shape or scores.ndim != 1:
                    raise EvaluationError("ROC.from_json: scores and positives differ in length")
                out._add(positives, scores)
            else:
                pos = np.asarray(data["positive_counts"], dtype=np.int64)
                neg = np.asarray(data["negative_counts"], dtype=np.int64)
                if pos.shape != out._pos_hist.shape or neg.shape != out._neg_hist.shape:
                    raise EvaluationError("ROC.from_json: histogram length does not match threshold_steps")
                out._pos_hist, out._neg_hist = pos, neg
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"ROC.from_json: malformed ({exc})") from exc
        return out

    def stats(self) -> str:
        mode = "exact" if self.exact else f"{self.threshold_steps} threshold steps"
        head = f"ROC ({mode}): {self.num_positives} positive, {self.num_negatives} negative examples"
        try:
            return f"{head}\nAUC:               {_fmt(self.auc())}\nAverage precision: " + _fmt(
                self.average_precision()
            )
        except EvaluationError as exc:
            return f"{head}\n{exc}"

    def __repr__(self) -> str:
        return f"ROC(threshold_steps={self.threshold_steps})"


class ROCMultiClass:
    """One-vs-all ROC per class of a multi-class classifier."""

    def __init__(self, threshold_steps: int = 0, num_classes: int | None = None) -> None:
        ROC(threshold_steps)  # validates threshold_steps
        self.threshold_steps = int(threshold_steps)
        self.num_classes: int | None = None
        self._rocs: list[ROC] = []
        if num_classes is not None:
            self._ensure(int(num_classes))

    def _ensure(self, num_classes: int) -> None:
        if self.num_classes is None:
            if num_classes < 2:
                raise EvaluationError(f"num_classes: expected at least 2 classes, got {num_classes}")
            self.num_classes = num_classes
            self._rocs = [ROC(self.threshold_steps) for _ in range(num_classes)]
        elif num_classes != self.num_classes:
            raise EvaluationError(f"expected {self.num_classes} classes (as before), got {num_classes}")

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one batch: labels one-hot (n, C) or class indices (n,); predictions (n, C)."""
        y = _array(labels, "labels")
        p = _array(predictions, "predictions")
        m = None if mask is None else _array(mask, "mask")
        y, p, m = _flatten_time(y, p, m, sequence_ndim=3)
        if p.ndim != 2:
            raise EvaluationError(f"predictions: expected class probabilities (n, C), got shape {p.shape}")
        _check_rows(y, p)
        num_classes = p.shape[1]
        if y.ndim == 2 and y.shape[1] != num_classes:
            raise EvaluationError(f"labels: expected (n, {num_classes}) like the predictions, got {y.shape}")
        actual = Evaluation._indices(y, num_classes, "labels")
        keep = _row_mask(m, y.shape[0])
        if keep is not None:
            actual, p = actual[keep], p[keep]
        self._ensure(num_classes)
        for c, roc in enumerate(self._rocs):
            roc._add(actual == c, p[:, c].astype(np.float64))

    def _roc(self, cls: int) -> ROC:
        if not isinstance(cls, int | np.integer) or not 0 <= cls < len(self._rocs):
            raise EvaluationError(f"cls: expected a class index in [0, {self.num_classes}), got {cls!r}")
        return self._rocs[int(cls)]

    def roc(self, cls: int) -> ROC:
        """The one-vs-all ROC of class ``cls``."""
        return self._roc(cls)

    def auc(self, cls: int) -> float:
        return self._roc(cls).auc()

    def average_precision(self, cls: int) -> float:
        return self._roc(cls).average_precision()

    def average_auc(self) -> float:
        """Mean one-vs-all AUC over the classes (scikit-learn's ``multi_class='ovr'``, macro)."""
        if not self._rocs:
            raise EvaluationError("no examples evaluated yet: call eval() (or merge) first")
        return float(np.mean([roc.auc() for roc in self._rocs]))

    def merge(self, other: ROCMultiClass) -> None:
        if not isinstance(other, ROCMultiClass):
            raise EvaluationError(f"merge: expected a ROCMultiClass, got {type(other).__name__}")
        if other.threshold_steps != self.threshold_steps:
            raise EvaluationError(
                f"merge: threshold_steps differ ({self.threshold_steps} vs {other.threshold_steps})"
            )
        if other.num_classes is None:
            return
        self._ensure(other.num_classes)
        for mine, theirs in zip(self._rocs, other._rocs, strict=True):
            mine.merge(theirs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "ROCMultiClass",
            "version": _VERSION,
            "threshold_steps": self.threshold_steps,
            "num_classes": self.num_classes,
            "rocs": [roc.to_dict() for roc in self._rocs],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> ROCMultiClass:
        data = _load(text, "ROCMultiClass")
        try:
            out = cls(data["threshold_steps"], data["num_classes"])
            rocs = [ROC.from_json(r) for r in data["rocs"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"ROCMultiClass.from_json: malformed ({exc})") from exc
        if len(rocs) != len(out._rocs) or any(r.threshold_steps != out.threshold_steps for r in rocs):
            raise EvaluationError("ROCMultiClass.from_json: per-class ROCs do not match num_classes/steps")
        out._rocs = rocs
        return out

    def stats(self) -> str:
        if not self._rocs:
            return "ROCMultiClass: no examples evaluated"
        mode = "exact" if self.threshold_steps == 0 else f"{self.threshold_steps} threshold steps"
        lines = [
            f"ROCMultiClass ({mode}), {self.num_classes} classes, one-vs-all",
            "class       AUC  avg.prec",
        ]
        aucs = []
        for c, roc in enumerate(self._rocs):
            try:
                auc, ap = roc.auc(), roc.average_precision()
                aucs.append(auc)
                lines.append(f"{c:>5}  {auc:>8.4f}  {ap:>8.4f}")
            except EvaluationError:
                lines.append(f"{c:>5}  {'n/a':>8}  {'n/a':>8}")
        if aucs:
            lines.append(f"Average AUC (classes with both outcomes): {np.mean(aucs):.4f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ROCMultiClass(threshold_steps={self.threshold_steps}, num_classes={self.num_classes})"


# --------------------------------------------------------------------------------------------------
# regression
# --------------------------------------------------------------------------------------------------
_REGRESSION_FIELDS = ("count", "label_mean", "label_m2", "pred_mean", "pred_m2", "comoment", "sse", "sae")


class RegressionEvaluation:
    """Per-column MSE, MAE, RMSE, R^2 and Pearson correlation from mergeable running sums."""

    def __init__(self, num_columns: int | None = None, column_names: list[str] | None = None) -> None:
        if column_names is not None:
            if num_columns is not None and len(column_names) != num_columns:
                raise EvaluationError(f"column_names: expected {num_columns} names, got {len(column_names)}")
            num_columns = len(column_names)
        if num_columns is not None and (not isinstance(num_columns, int | np.integer) or num_columns < 1):
            raise EvaluationError(f"num_columns: expected a positive integer or None, got {num_columns!r}")
        self.num_columns: int | None = None
        self.column_names = None if column_names is None else [str(c) for c in column_names]
        self._stats: dict[str, np.ndarray] = {}
        if num_columns is not None:
            self._ensure(int(num_columns))

    def _ensure(self, k: int) -> None:
        if self.num_columns is None:
            self.num_columns = k
            self._stats = {name: np.zeros(k, np.float64) for name in _REGRESSION_FIELDS}
        elif k != self.num_columns:
            raise EvaluationError(f"expected {self.num_columns} columns (as before), got {k}")

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one batch of targets and predictions (same shape)."""
        y = _array(labels, "labels").astype(np.float64)
        p = _array(predictions, "predictions").astype(np.float64)
        m = None if mask is None else _array(mask, "mask")
        if p.ndim == 3 and m is not None and m.ndim == 2 and m.shape == p.shape[:2]:
            y, p, m = _flatten_time(y, p, m, sequence_ndim=3)
        elif p.ndim == 3:
            y, p, m = _flatten_time(y, p, None, sequence_ndim=3)
        if y.ndim == 1:
            y = y[:, None]
        if p.ndim == 1:
            p = p[:, None]
        if y.shape != p.shape or y.ndim != 2:
            raise EvaluationError(
                f"labels and predictions: expected the same shape (n, k), got {y.shape} and {p.shape}"
            )
        n, k = y.shape
        if m is None:
            weights = np.ones((n, k))
        elif m.shape == (n,) or m.shape == (n, 1):
            weights = np.repeat((m.reshape(n, 1) != 0).astype(np.float64), k, axis=1)
        elif m.shape == (n, k):
            weights = (m != 0).astype(np.float64)
        else:
            raise EvaluationError(f"mask: expected shape ({n},) or ({n}, {k}), got {m.shape}")
        self._ensure(k)
        count = weights.sum(axis=0)
        label_mean = _safe_div((weights * y).sum(axis=0), count)
        pred_mean = _safe_div((weights * p).sum(axis=0), count)
        dy, dp = y - label_mean, p - pred_mean
        batch = {
            "count": count,
            "label_mean": label_mean,
            "label_m2": (weights * dy * dy).sum(axis=0),
            "pred_mean": pred_mean,
            "pred_m2": (weights * dp * dp).sum(axis=0),
            "comoment": (weights * dy * dp).sum(axis=0),
            "sse": (weights * (y - p) ** 2).sum(axis=0),
            "sae": (weights * np.abs(y - p)).sum(axis=0),
        }
        self._combine(batch)

    def _combine(self, other: dict[str, np.ndarray]) -> None:
        """Chan et al.'s pairwise update of means and (co)moments."""
        a, b = self._stats, other
        total = a["count"] + b["count"]
        fa = _safe_div(a["count"], total)
        fb = _safe_div(b["count"], total)
        cross = _safe_div(a["count"] * b["count"], total)
        d_label = b["label_mean"] - a["label_mean"]
        d_pred = b["pred_mean"] - a["pred_mean"]
        self._stats = {
            "count": total,
            "label_mean": a["label_mean"] * fa + b["label_mean"] * fb,
            "pred_mean": a["pred_mean"] * fa + b["pred_mean"] * fb,
            "label_m2": a["label_m2"] + b["label_m2"] + d_label**2 * cross,
            "pred_m2": a["pred_m2"] + b["pred_m2"] + d_pred**2 * cross,
            "comoment": a["comoment"] + b["comoment"] + d_label * d_pred * cross,
            "sse": a["sse"] + b["sse"],
            "sae": a["sae"] + b["sae"],
        }

    def merge(self, other: RegressionEvaluation) -> None:
        if not isinstance(other, RegressionEvaluation):
            raise EvaluationError(f"merge: expected a RegressionEvaluation, got {type(other).__name__}")
        if other.num_columns is None:
            return
        self._ensure(other.num_columns)
        self._combine(other._stats)
        if self.column_names is None and other.column_names is not None:
            self.column_names = list(other.column_names)

    # -- metrics -----------------------------------------------------------------------------
    def _column_values(self, values: np.ndarray, col: int | None) -> float:
        if col is None:
            return float(np.mean(values))
        if not isinstance(col, int | np.integer) or not 0 <= col < len(values):
            raise EvaluationError(f"col: expected a column index in [0, {self.num_columns}), got {col!r}")
        return float(values[int(col)])

    def _require(self) -> dict[str, np.ndarray]:
        if not self._stats or not np.all(self._stats["count"] > 0):
            raise EvaluationError("no examples evaluated yet for every column: call eval() (or merge) first")
        return self._stats

    @property
    def num_examples(self) -> int:
        """Examples counted in the first column (columns differ only under per-column masks)."""
        return int(self._stats["count"][0]) if self._stats else 0

    def mean_squared_error(self, col: int | None = None) -> float:
        """MSE of one column, or the mean over columns."""
        s = self._require()
        return self._column_values(s["sse"] / s["count"], col)

    def mean_absolute_error(self, col: int | None = None) -> float:
        s = self._require()
        return self._column_values(s["sae"] / s["count"], col)

    def root_mean_squared_error(self, col: int | None = None) -> float:
        """RMSE of one column, or the mean of the per-column RMSEs."""
        s = self._require()
        return self._column_values(np.sqrt(s["sse"] / s["count"]), col)

    def r_squared(self, col: int | None = None) -> float:
        """Coefficient of determination (1 - SSE/SStot); a constant column scores 1 if exact, else 0."""
        s = self._require()
        constant = s["label_m2"] == 0
        r2 = np.where(constant, np.where(s["sse"] == 0, 1.0, 0.0), 1.0 - _safe_div(s["sse"], s["label_m2"]))
        return self._column_values(r2, col)

    def pearson_correlation(self, col: int | None = None) -> float:
        s = self._require()
        return self._column_values(_safe_div(s["comoment"], np.sqrt(s["label_m2"] * s["pred_m2"])), col)

    # -- persistence and text ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "RegressionEvaluation",
            "version": _VERSION,
            "num_columns": self.num_columns,
            "column_names": self.column_names,
            "stats": {name: values.tolist() for name, values in self._stats.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> RegressionEvaluation:
        data = _load(text, "RegressionEvaluation")
        try:
            out = cls(data["num_columns"], data["column_names"])
            if out.num_columns is not None:
                stats = {
                    name: np.asarray(data["stats"][name], dtype=np.float64) for name in _REGRESSION_FIELDS
                }
                if any(v.shape != (out.num_columns,) for v in stats.values()):
                    raise EvaluationError(
                        "RegressionEvaluation.from_json: statistics do not match num_columns"
                    )
                out._stats = stats
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"RegressionEvaluation.from_json: malformed ({exc})") from exc
        return out

    def stats(self) -> str:
        if not self._stats or not np.any(self._stats["count"] > 0):
            return "RegressionEvaluation: no examples evaluated"
        names = self.column_names or [f"col_{i}" for i in range(self.num_columns or 0)]
        width = max(8, *(len(n) for n in names))
        lines = [f"{'column':>{width}}  {'MSE':>11}  {'MAE':>11}  {'RMSE':>11}  {'R^2':>8}  {'pearson':>8}"]
        try:
            s = self._require()
        except EvaluationError as exc:
            return str(exc)
        for i, name in [*enumerate(names), (None, "average")]:
            values = (
                self.mean_squared_error(i),
                self.mean_absolute_error(i),
                self.root_mean_squared_error(i),
            )
            lines.append(
                f"{name:>{width}}  "
                + "  ".join(f"{v:>11.5g}" for v in values)
                + f"  {self.r_squared(i):>8.4f}  {self.pearson_correlation(i):>8.4f}"
            )
        lines.append(f"examples: {int(s['count'].max())}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"RegressionEvaluation(num_columns={self.num_columns}, examples={self.num_examples})"


_KINDS: dict[str, Any] = {
    "Evaluation": Evaluation,
    "ROC": ROC,
    "ROCMultiClass": ROCMultiClass,
    "RegressionEvaluation": RegressionEvaluation,
}


def evaluation_from_json(
    text: str | bytes | dict[str, Any],
) -> Evaluation | ROC | ROCMultiClass | RegressionEvaluation:
    """Rebuild any evaluation from its ``to_json()`` text, dispatching on its ``type``."""
    try:
        data = text if isinstance(text, dict) else json.loads(text)
    except ValueError as exc:
        raise EvaluationError(f"evaluation_from_json: not valid JSON ({exc})") from exc
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in _KINDS:
        raise EvaluationError(
            f"evaluation_from_json: unknown evaluation type {kind!r}; known: {sorted(_KINDS)}"
        )
    return _KINDS[kind].from_json(data)
