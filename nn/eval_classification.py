"""Classification evaluation: a confusion matrix, and accuracy, precision, recall and F1 from it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from psrv.nn.errors import EvaluationError
from psrv.nn.eval_common import (
    VERSION,
    batch_arrays,
    check_rows,
    class_indices,
    fmt,
    load_json,
    row_mask,
    safe_div,
)

__all__ = ["Evaluation"]


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
        y, p, m = batch_arrays(labels, predictions, mask)
        if p.ndim == 2 and y.ndim == 2 and p.shape[1] != y.shape[1]:
            raise EvaluationError(
                f"labels and predictions: expected the same number of classes, got labels {y.shape} and "
                f"predictions {p.shape}"
            )
        check_rows(y, p)
        keep = row_mask(m, y.shape[0])
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
        actual = class_indices(y, num_classes, "labels")
        predicted = np.argmax(p, axis=1) if p.ndim == 2 else class_indices(p, num_classes, "predictions")
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
        precision = safe_div(tp, tp + fp)
        recall = safe_div(tp, tp + fn)
        if metric == "precision":
            return precision
        if metric == "recall":
            return recall
        return safe_div(2 * precision * recall, precision + recall)

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
            "version": VERSION,
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
        data = load_json(text, "Evaluation")
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
            f"Accuracy:            {fmt(self.accuracy())}",
            f"Precision (macro):   {fmt(self.precision())}",
            f"Recall (macro):      {fmt(self.recall())}",
            f"F1 (macro):          {fmt(self.f1())}",
        ]
        if self.top_n > 1:
            lines.append(f"Top-{self.top_n} accuracy:      {fmt(self.top_n_accuracy())}")
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
