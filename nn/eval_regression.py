"""Regression evaluation: per-column MSE, MAE, RMSE, R^2 and Pearson correlation from mergeable sums."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from psrv.nn.errors import EvaluationError
from psrv.nn.eval_common import VERSION, as_array, flatten_time, load_json, safe_div

__all__ = ["RegressionEvaluation"]


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
        y = as_array(labels, "labels").astype(np.float64)
        p = as_array(predictions, "predictions").astype(np.float64)
        m = None if mask is None else as_array(mask, "mask")
        if p.ndim == 3 and y.ndim == 2 and y.shape == p.shape[:2] and p.shape[2] == 1:
            y = y[:, :, None]  # one target per time step, (n, T), for an (n, T, 1) output
        y, p, m = flatten_time(y, p, m, sequence_ndim=3)
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
        label_mean = safe_div((weights * y).sum(axis=0), count)
        pred_mean = safe_div((weights * p).sum(axis=0), count)
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
        fa = safe_div(a["count"], total)
        fb = safe_div(b["count"], total)
        cross = safe_div(a["count"] * b["count"], total)
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
        r2 = np.where(constant, np.where(s["sse"] == 0, 1.0, 0.0), 1.0 - safe_div(s["sse"], s["label_m2"]))
        return self._column_values(r2, col)

    def pearson_correlation(self, col: int | None = None) -> float:
        s = self._require()
        return self._column_values(safe_div(s["comoment"], np.sqrt(s["label_m2"] * s["pred_m2"])), col)

    # -- persistence and text ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "RegressionEvaluation",
            "version": VERSION,
            "num_columns": self.num_columns,
            "column_names": self.column_names,
            "stats": {name: values.tolist() for name, values in self._stats.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> RegressionEvaluation:
        data = load_json(text, "RegressionEvaluation")
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
