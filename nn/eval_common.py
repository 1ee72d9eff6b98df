"""Input checks and small helpers shared by the evaluation modules (eval_classification, eval_roc,
eval_regression): array validation, sequence flattening, masks, the JSON envelope, safe division."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from psrv.nn.errors import EvaluationError

#: the version of every evaluation's JSON form
VERSION = 1


def as_array(value: Any, what: str) -> np.ndarray:
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


def flatten_time(
    labels: np.ndarray, predictions: np.ndarray, mask: np.ndarray | None, *, sequence_ndim: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Time series: a sequence batch becomes one row per time step, masked steps dropped.

    Predictions ``(n, T, k)`` with labels ``(n, T, k)`` (or ``(n, T)`` class indices / one value per
    step) give ``(n*T, k)`` rows. A step mask ``(n, T)`` (or ``(n, T, 1)``) removes the masked steps
    here, so every evaluation counts only the steps that exist; a per-output mask ``(n, T, k)`` becomes
    ``(n*T, k)`` for the evaluations that take one mask per label or column. Anything else passes as is.
    """
    if predictions.ndim != sequence_ndim:
        return labels, predictions, mask
    return flatten_positions(labels, predictions, mask, lead=2)


def flatten_positions(
    labels: np.ndarray, predictions: np.ndarray, mask: np.ndarray | None, *, lead: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The one place a batch with positions (time steps, pixels) becomes evaluation rows.

    The first ``lead`` axes (the examples, then their positions) become one row each; what follows them
    (the classes, last) stays. A mask over those axes (``predictions.shape[:lead]``, or with a trailing 1)
    drops the rows it masks, so every evaluation counts only the positions that exist; a mask of the
    predictions' own shape is flattened alongside, for the evaluations that weigh each element.
    """
    head = predictions.shape[:lead]
    if labels.shape[:lead] != head:
        described = ", ".join(str(d) for d in head)
        raise EvaluationError(
            f"labels: expected a batch of shape ({described}, ...) like the predictions, got {labels.shape}"
        )
    rows = int(np.prod(head))
    flat_labels = labels.reshape(rows, *labels.shape[lead:])
    flat_predictions = predictions.reshape(rows, *predictions.shape[lead:])
    if mask is None:
        return flat_labels, flat_predictions, None
    if mask.shape in (head, (*head, 1)):
        keep = mask.reshape(-1) != 0
        return flat_labels[keep], flat_predictions[keep], None
    if mask.shape == predictions.shape:
        return flat_labels, flat_predictions, mask.reshape(rows, *mask.shape[lead:])
    described = ", ".join(str(d) for d in head)
    raise EvaluationError(
        f"mask: expected shape ({described}) (one value per position) or {predictions.shape} (one per "
        f"output) for this batch, got {mask.shape}"
    )


def class_rows(y: np.ndarray, p: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(true class per row, class probabilities, number of classes) of an (n, C) batch, the rows a
    mask removes dropped: what the per-class evaluations (ROC, calibration) count."""
    num_classes = p.shape[1]
    if y.ndim == 2 and y.shape[1] != num_classes:
        raise EvaluationError(f"labels: expected (n, {num_classes}) like the predictions, got {y.shape}")
    actual = class_indices(y, num_classes, "labels")
    keep = row_mask(mask, y.shape[0])
    if keep is not None:
        actual, p = actual[keep], p[keep]
    return actual, p, num_classes


def row_mask(mask: Any, n: int) -> np.ndarray | None:
    if mask is None:
        return None
    m = as_array(mask, "mask")
    if m.ndim == 2 and m.shape[1] == 1:
        m = m[:, 0]
    if m.shape != (n,):
        raise EvaluationError(f"mask: expected shape ({n},) (one value per example), got {m.shape}")
    return m != 0


def check_rows(labels: np.ndarray, predictions: np.ndarray) -> None:
    if labels.shape[0] != predictions.shape[0]:
        raise EvaluationError(
            f"labels and predictions: expected the same number of rows, got {labels.shape[0]} and "
            f"{predictions.shape[0]}"
        )


def batch_arrays(
    labels: Any, predictions: Any, mask: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One eval() batch checked as numeric arrays; sequence batches (n, T, C) flattened to rows."""
    y = as_array(labels, "labels")
    p = as_array(predictions, "predictions")
    m = None if mask is None else as_array(mask, "mask")
    return flatten_time(y, p, m, sequence_ndim=3)


def parse_json(text: str | bytes | dict[str, Any], who: str) -> Any:
    """``text`` parsed (a dict passes through); invalid JSON is an EvaluationError naming ``who``."""
    try:
        return text if isinstance(text, dict) else json.loads(text)
    except ValueError as exc:
        raise EvaluationError(f"{who}: not valid JSON ({exc})") from exc


def load_json(text: str | bytes | dict[str, Any], kind: str) -> dict[str, Any]:
    """The JSON form of one evaluation kind, with its type and version checked."""
    data = parse_json(text, f"{kind}.from_json")
    if not isinstance(data, dict) or data.get("type") != kind:
        got = data.get("type") if isinstance(data, dict) else type(data).__name__
        raise EvaluationError(f"{kind}.from_json: expected a JSON object of type {kind!r}, got {got!r}")
    if data.get("version") != VERSION:
        raise EvaluationError(f"{kind}.from_json: unsupported version {data.get('version')!r}")
    return data


def safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den != 0)


def fmt(value: float) -> str:
    return f"{value:.4f}" if np.isfinite(value) else "n/a"


def class_indices(values: np.ndarray, num_classes: int, what: str) -> np.ndarray:
    """Class index per row: argmax of (n, C) scores, or checked integer labels (n,)."""
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


__all__ = [
    "VERSION",
    "as_array",
    "batch_arrays",
    "check_rows",
    "class_rows",
    "class_indices",
    "flatten_positions",
    "flatten_time",
    "fmt",
    "load_json",
    "parse_json",
    "row_mask",
    "safe_div",
]
