"""ROC evaluations: binary (exact or thresholded histogram) and one-vs-all per class."""

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
    fmt,
    load_json,
    row_mask,
    safe_div,
)

__all__ = ["ROC", "ROCMultiClass"]


def _checked_steps(threshold_steps: int) -> int:
    if not isinstance(threshold_steps, int | np.integer) or threshold_steps < 0:
        raise EvaluationError(f"threshold_steps: expected an integer >= 0, got {threshold_steps!r}")
    return int(threshold_steps)


def _binary_inputs(labels: Any, predictions: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
    y, p, m = batch_arrays(labels, predictions, mask)
    check_rows(y, p)

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
    keep = row_mask(m, y.shape[0])
    if keep is not None:
        y, p = y[keep], p[keep]
    return y.astype(bool), p.astype(np.float64)


class ROC:
    """Binary ROC. ``threshold_steps=0``: exact (keeps every score); N > 0: N+1 fixed thresholds."""

    def __init__(self, threshold_steps: int = 0) -> None:
        self.threshold_steps = _checked_steps(threshold_steps)
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
        precision = safe_div(tp, tp + fp)
        return float(np.sum(np.diff(recall) * precision[1:]))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": "ROC", "version": VERSION, "threshold_steps": self.threshold_steps}
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
        data = load_json(text, "ROC")
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
            return f"{head}\nAUC:               {fmt(self.auc())}\nAverage precision: " + fmt(
                self.average_precision()
            )
        except EvaluationError as exc:
            return f"{head}\n{exc}"

    def __repr__(self) -> str:
        return f"ROC(threshold_steps={self.threshold_steps})"


class ROCMultiClass:
    """One-vs-all ROC per class of a multi-class classifier."""

    def __init__(self, threshold_steps: int = 0, num_classes: int | None = None) -> None:
        self.threshold_steps = _checked_steps(threshold_steps)
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
        y, p, m = batch_arrays(labels, predictions, mask)
        if p.ndim != 2:
            raise EvaluationError(f"predictions: expected class probabilities (n, C), got shape {p.shape}")
        check_rows(y, p)
        actual, p, num_classes = class_rows(y, p, m)
        self._ensure(num_classes)
        for c, roc in enumerate(self._rocs):
            roc._add(actual == c, p[:, c].astype(np.float64))

    def roc(self, cls: int) -> ROC:
        """The one-vs-all ROC of class ``cls``."""
        if not isinstance(cls, int | np.integer) or not 0 <= cls < len(self._rocs):
            raise EvaluationError(f"cls: expected a class index in [0, {self.num_classes}), got {cls!r}")
        return self._rocs[int(cls)]

    def auc(self, cls: int) -> float:
        return self.roc(cls).auc()

    def average_precision(self, cls: int) -> float:
        return self.roc(cls).average_precision()

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
            "version": VERSION,
            "threshold_steps": self.threshold_steps,
            "num_classes": self.num_classes,
            "rocs": [roc.to_dict() for roc in self._rocs],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> ROCMultiClass:
        data = load_json(text, "ROCMultiClass")
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
