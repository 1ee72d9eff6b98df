"""Evaluations: classification, ROC (binary and one-vs-all), regression, multi-label (per-label
metrics and ROCs) and calibration.

This module gathers them (eval_classification, eval_roc, eval_regression, eval_binary,
eval_calibration) and rebuilds any of them from JSON.

Every evaluation accumulates sufficient statistics batch by batch (``eval``), so partial results
from many Spark tasks combine with ``merge`` into exactly what evaluating the union would give, and
each round-trips through JSON (``to_json`` / ``from_json``; ``evaluation_from_json`` for any kind).

Shapes accepted by ``eval``:

- classification labels: one-hot ``(n, C)`` or class indices ``(n,)``; predictions: probabilities
  ``(n, C)`` (or class indices ``(n,)``, top-1 only); sequences ``(n, T, C)`` with a mask ``(n, T)``.
- ROC labels: ``(n,)``/``(n, 1)`` of 0/1 or one-hot ``(n, 2)``; predictions: probability of the
  positive class ``(n,)``/``(n, 1)`` or ``(n, 2)`` (column 1 is used).
- regression: ``(n, k)`` or ``(n,)``; masks ``(n,)``, ``(n, k)`` (per column) or ``(n, T)`` (sequences).
- multi-label (EvaluationBinary, ROCBinary): labels 0/1 and probabilities ``(n, k)``; masks ``(n,)`` or
  ``(n, k)`` (per label).
- calibration: as classification, with probabilities (a single sigmoid column counts as two classes).

Time series: every kind takes predictions ``(n, T, k)`` with labels ``(n, T, k)`` or ``(n, T)`` and an
optional ``(n, T)`` step mask, and evaluates one row per time step with the masked steps dropped
(``eval_common.flatten_time``, the one place that does it).

Masked rows (mask 0) are skipped. Undefined per-class ratios (no predictions of a class, say) count
as 0, as scikit-learn's ``zero_division=0``; macro averages run over all classes.
"""

from __future__ import annotations

from typing import Any

from psrv.nn.errors import EvaluationError
from psrv.nn.eval_binary import EvaluationBinary, ROCBinary
from psrv.nn.eval_calibration import EvaluationCalibration
from psrv.nn.eval_classification import Evaluation
from psrv.nn.eval_common import parse_json
from psrv.nn.eval_regression import RegressionEvaluation
from psrv.nn.eval_roc import ROC, ROCMultiClass

__all__ = [
    "ROC",
    "Evaluation",
    "EvaluationBinary",
    "EvaluationCalibration",
    "ROCBinary",
    "ROCMultiClass",
    "RegressionEvaluation",
    "evaluation_from_json",
]


_KINDS: dict[str, Any] = {
    "Evaluation": Evaluation,
    "ROC": ROC,
    "ROCMultiClass": ROCMultiClass,
    "RegressionEvaluation": RegressionEvaluation,
    "EvaluationBinary": EvaluationBinary,
    "ROCBinary": ROCBinary,
    "EvaluationCalibration": EvaluationCalibration,
}


def evaluation_from_json(text: str | bytes | dict[str, Any]) -> Any:
    """Rebuild any evaluation from its ``to_json()`` text, dispatching on its ``type``."""
    data = parse_json(text, "evaluation_from_json")
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in _KINDS:
        raise EvaluationError(
            f"evaluation_from_json: unknown evaluation type {kind!r}; known: {sorted(_KINDS)}"
        )
    return _KINDS[kind].from_json(data)
