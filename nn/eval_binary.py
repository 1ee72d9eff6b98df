"""Multi-label evaluations of independent sigmoid outputs: one set of metrics, or one ROC, per label.

A network with ``k`` sigmoid outputs answers ``k`` yes/no questions at once (tags of an image, say).
``EvaluationBinary`` counts true/false positives and negatives per label at a decision threshold
(0.5, or one per label); ``ROCBinary`` keeps one ROC per label. Masks may be per example ``(n,)`` or
per label ``(n, k)`` (a label missing for some examples); time series go through the shared helper.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from psrv.nn.errors import EvaluationError
from psrv.nn.eval_common import VERSION, batch_arrays, check_rows, fmt, load_json, safe_div
from psrv.nn.eval_roc import ROC

__all__ = ["EvaluationBinary", "ROCBinary", "multilabel_arrays"]

_COUNTS = ("true_positives", "false_positives", "true_negatives", "false_negatives")


def multilabel_arrays(labels: Any, predictions: Any, mask: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels as bool (n, k), probabilities (n, k), weights as bool (n, k)) of one batch."""
    y, p, m = batch_arrays(labels, predictions, mask)
    if y.ndim == 1:
        y = y[:, None]
    if p.ndim == 1:
        p = p[:, None]
    check_rows(y, p)
    if y.ndim != 2 or y.shape != p.shape:
        raise EvaluationError(
            f"labels and predictions: expected the same shape (n, labels) (or (n, T, labels)), got {y.shape} "
            f"and {p.shape}"
        )
    if y.size and not np.all((y == 0) | (y == 1)):
        raise EvaluationError("labels: expected 0 or 1 for every label of a multi-label evaluation")
    n, k = y.shape
    if m is None:
        keep = np.ones((n, k), bool)
    elif m.shape in ((n,), (n, 1)):
        keep = np.repeat(m.reshape(n, 1) != 0, k, axis=1)
    elif m.shape == (n, k):
        keep = m != 0
    else:
        raise EvaluationError(
            f"mask: expected shape ({n},) (per example) or ({n}, {k}) (per label), got {m.shape}")
    return y.astype(bool), p.astype(np.float64), keep


def _label_names(names: list[str] | None, k: int | None) -> list[str] | None:
    if names is None:
        return None
    if k is not None and len(names) != k:
        raise EvaluationError(f"label_names: expected {k} names, got {len(names)}")
    return [str(n) for n in names]


class EvaluationBinary:
    """Per-label accuracy, precision, recall, F1 of multi-label sigmoid outputs.

    A label is predicted positive when its probability is >= its decision threshold: ``threshold``
    (0.5) for every label, or ``thresholds`` (one per label).
    """

    def __init__(self, num_labels: int | None = None, threshold: float = 0.5,
                 thresholds: list[float] | None = None, label_names: list[str] | None = None) -> None:
        if num_labels is not None and (not isinstance(num_labels, int | np.integer) or num_labels < 1):
            raise EvaluationError(f"num_labels: expected a positive integer or None, got {num_labels!r}")
        if thresholds is not None:
            if num_labels is not None and len(thresholds) != num_labels:
                raise EvaluationError(f"thresholds: expected {num_labels} values (one per label), got "
                                      f"{len(thresholds)}")
            num_labels = len(thresholds)
        if label_names is not None and num_labels is None:
            num_labels = len(label_names)
        self.label_names = _label_names(label_names, num_labels)
        self.threshold = float(threshold)
        self.thresholds = None if thresholds is None else [float(t) for t in thresholds]
        for t in [self.threshold, *(self.thresholds or [])]:
            if not 0.0 <= t <= 1.0:
                raise EvaluationError(f"threshold: expected a probability in [0, 1], got {t!r}")
        self.num_labels: int | None = None
        self._counts: dict[str, np.ndarray] = {}
        if num_labels is not None:
            self._ensure(int(num_labels))

    def _ensure(self, k: int) -> None:
        if self.num_labels is None:
            self.num_labels = k
            self._counts = {name: np.zeros(k, np.int64) for name in _COUNTS}
        elif k != self.num_labels:
            raise EvaluationError(f"expected {self.num_labels} labels (as before), got {k}")

    def decision_thresholds(self) -> np.ndarray:
        """The threshold of each label."""
        if self.thresholds is not None:
            return np.asarray(self.thresholds)
        return np.full(self.num_labels or 0, self.threshold)

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one batch: labels 0/1 and probabilities, both (n, k) (or (n, T, k))."""
        y, p, keep = multilabel_arrays(labels, predictions, mask)
        self._ensure(y.shape[1])
        predicted = p >= self.decision_thresholds()
        for name, cells in zip(_COUNTS, (predicted & y, predicted & ~y, ~predicted & ~y, ~predicted & y),
                               strict=True):
            self._counts[name] += (cells & keep).sum(axis=0)

    def merge(self, other: EvaluationBinary) -> None:
        """Add another evaluation's counts into this one (in place)."""
        if not isinstance(other, EvaluationBinary):
            raise EvaluationError(f"merge: expected an EvaluationBinary, got {type(other).__name__}")
        if other.threshold != self.threshold or other.thresholds != self.thresholds:
            raise EvaluationError("merge: decision thresholds differ")
        if other.num_labels is None:
            return
        self._ensure(other.num_labels)
        for name in _COUNTS:
            self._counts[name] += other._counts[name]
        if self.label_names is None and other.label_names is not None:
            self.label_names = list(other.label_names)

    # -- metrics -----------------------------------------------------------------------------
    def _require(self) -> dict[str, np.ndarray]:
        if not self._counts:
            raise EvaluationError("no examples evaluated yet: call eval() (or merge) first")
        return {name: v.astype(np.float64) for name, v in self._counts.items()}

    def _pick(self, values: np.ndarray, label: int | None) -> float:
        if label is None:
            return float(values.mean())  # macro average over the labels
        if not isinstance(label, int | np.integer) or not 0 <= label < len(values):
            raise EvaluationError(f"label: expected a label index in [0, {self.num_labels}), got {label!r}")
        return float(values[int(label)])

    def count(self, label: int) -> int:
        """How many (unmasked) examples label ``label`` was evaluated on."""
        c = self._require()
        return int(self._pick(sum(c[n] for n in _COUNTS), label))

    def true_positives(self, label: int) -> int:
        return int(self._pick(self._require()["true_positives"], label))

    def false_positives(self, label: int) -> int:
        return int(self._pick(self._require()["false_positives"], label))

    def true_negatives(self, label: int) -> int:
        return int(self._pick(self._require()["true_negatives"], label))

    def false_negatives(self, label: int) -> int:
        return int(self._pick(self._require()["false_negatives"], label))

    def accuracy(self, label: int | None = None) -> float:
        """Accuracy of one label, or the mean over labels."""
        c = self._require()
        total = sum(c[n] for n in _COUNTS)
        return self._pick(safe_div(c["true_positives"] + c["true_negatives"], total), label)

    def precision(self, label: int | None = None) -> float:
        c = self._require()
        return self._pick(safe_div(c["true_positives"], c["true_positives"] + c["false_positives"]), label)

    def recall(self, label: int | None = None) -> float:
        c = self._require()
        return self._pick(safe_div(c["true_positives"], c["true_positives"] + c["false_negatives"]), label)

    def f1(self, label: int | None = None) -> float:
        c = self._require()
        tp, fp, fn = c["true_positives"], c["false_positives"], c["false_negatives"]
        return self._pick(safe_div(2 * tp, 2 * tp + fp + fn), label)

    def false_positive_rate(self, label: int | None = None) -> float:
        c = self._require()
        return self._pick(safe_div(c["false_positives"], c["false_positives"] + c["true_negatives"]), label)

    def false_negative_rate(self, label: int | None = None) -> float:
        c = self._require()
        return self._pick(safe_div(c["false_negatives"], c["false_negatives"] + c["true_positives"]), label)

    # -- persistence and text ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "EvaluationBinary", "version": VERSION, "num_labels": self.num_labels,
            "threshold": self.threshold, "thresholds": self.thresholds, "label_names": self.label_names,
            "counts": {name: v.tolist() for name, v in self._counts.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> EvaluationBinary:
        data = load_json(text, "EvaluationBinary")
        try:
            out = cls(data["num_labels"], data["threshold"], data["thresholds"], data["label_names"])
            if out.num_labels is not None:
                counts = {name: np.asarray(data["counts"][name], np.int64) for name in _COUNTS}
                if any(v.shape != (out.num_labels,) for v in counts.values()):
                    raise EvaluationError("EvaluationBinary.from_json: counts do not match num_labels")
                out._counts = counts
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"EvaluationBinary.from_json: malformed ({exc})") from exc
        return out

    def stats(self) -> str:
        if not self._counts:
            return "EvaluationBinary: no examples evaluated"
        names = self.label_names or [str(i) for i in range(self.num_labels or 0)]
        width = max(8, *(len(n) for n in names))
        lines = [f"{'label':>{width}}  {'count':>7}  {'threshold':>9}  {'accuracy':>8}  {'precision':>9}  "
                 f"{'recall':>7}  {'f1':>7}"]
        for i, name in enumerate(names):
            lines.append(f"{name:>{width}}  {self.count(i):>7}  {self.decision_thresholds()[i]:>9.3f}  "
                         f"{fmt(self.accuracy(i)):>8}  {fmt(self.precision(i)):>9}  "
                         f"{fmt(self.recall(i)):>7}  {fmt(self.f1(i)):>7}")
        lines.append(f"{'average':>{width}}  {'':>7}  {'':>9}  {fmt(self.accuracy()):>8}  "
                     f"{fmt(self.precision()):>9}  {fmt(self.recall()):>7}  {fmt(self.f1()):>7}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"EvaluationBinary(num_labels={self.num_labels}, threshold={self.threshold})"


class ROCBinary:
    """One binary ROC per label of a multi-label output (``threshold_steps`` as for ROC)."""

    def __init__(self, threshold_steps: int = 0, num_labels: int | None = None,
                 label_names: list[str] | None = None) -> None:
        self.threshold_steps = ROC(threshold_steps).threshold_steps  # checks the value
        if label_names is not None and num_labels is None:
            num_labels = len(label_names)
        self.label_names = _label_names(label_names, num_labels)
        self.num_labels: int | None = None
        self._rocs: list[ROC] = []
        if num_labels is not None:
            self._ensure(int(num_labels))

    def _ensure(self, k: int) -> None:
        if self.num_labels is None:
            if k < 1:
                raise EvaluationError(f"num_labels: expected at least 1 label, got {k}")
            self.num_labels = k
            self._rocs = [ROC(self.threshold_steps) for _ in range(k)]
        elif k != self.num_labels:
            raise EvaluationError(f"expected {self.num_labels} labels (as before), got {k}")

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Add one batch: labels 0/1 and probabilities, both (n, k) (or (n, T, k))."""
        y, p, keep = multilabel_arrays(labels, predictions, mask)
        self._ensure(y.shape[1])
        for i, roc in enumerate(self._rocs):
            roc._add(y[keep[:, i], i], p[keep[:, i], i])

    def roc(self, label: int) -> ROC:
        """The ROC of label ``label``."""
        if not isinstance(label, int | np.integer) or not 0 <= label < len(self._rocs):
            raise EvaluationError(f"label: expected a label index in [0, {self.num_labels}), got {label!r}")
        return self._rocs[int(label)]

    def auc(self, label: int) -> float:
        return self.roc(label).auc()

    def average_precision(self, label: int) -> float:
        return self.roc(label).average_precision()

    def average_auc(self) -> float:
        """Mean AUC over the labels (scikit-learn's ``roc_auc_score(average='macro')``)."""
        if not self._rocs:
            raise EvaluationError("no examples evaluated yet: call eval() (or merge) first")
        return float(np.mean([roc.auc() for roc in self._rocs]))

    def merge(self, other: ROCBinary) -> None:
        if not isinstance(other, ROCBinary):
            raise EvaluationError(f"merge: expected a ROCBinary, got {type(other).__name__}")
        if other.threshold_steps != self.threshold_steps:
            raise EvaluationError(
                f"merge: threshold_steps differ ({self.threshold_steps} vs {other.threshold_steps})"
            )
        if other.num_labels is None:
            return
        self._ensure(other.num_labels)
        for mine, theirs in zip(self._rocs, other._rocs, strict=True):
            mine.merge(theirs)
        if self.label_names is None and other.label_names is not None:
            self.label_names = list(other.label_names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "ROCBinary", "version": VERSION, "threshold_steps": self.threshold_steps,
            "num_labels": self.num_labels, "label_names": self.label_names,
            "rocs": [roc.to_dict() for roc in self._rocs],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> ROCBinary:
        data = load_json(text, "ROCBinary")
        try:
            out = cls(data["threshold_steps"], data["num_labels"], data["label_names"])
            rocs = [ROC.from_json(r) for r in data["rocs"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"ROCBinary.from_json: malformed ({exc})") from exc
        if len(rocs) != len(out._rocs) or any(r.threshold_steps != out.threshold_steps for r in rocs):
            raise EvaluationError("ROCBinary.from_json: per-label ROCs do not match num_labels/steps")
        out._rocs = rocs
        return out

    def stats(self) -> str:
        if not self._rocs:
            return "ROCBinary: no examples evaluated"
        names = self.label_names or [str(i) for i in range(self.num_labels or 0)]
        width = max(8, *(len(n) for n in names))
        lines = [f"ROCBinary, {self.num_labels} labels", f"{'label':>{width}}  {'AUC':>8}  {'avg.prec':>8}"]
        for name, roc in zip(names, self._rocs, strict=True):
            try:
                lines.append(f"{name:>{width}}  {roc.auc():>8.4f}  {roc.average_precision():>8.4f}")
            except EvaluationError:
                lines.append(f"{name:>{width}}  {'n/a':>8}  {'n/a':>8}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ROCBinary(threshold_steps={self.threshold_steps}, num_labels={self.num_labels})"
