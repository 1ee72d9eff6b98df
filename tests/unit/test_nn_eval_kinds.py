"""Multi-label, calibration and time-series evaluations against scikit-learn on the same predictions;
merge of two halves equals the whole; JSON round trips exactly; per output of a network of several."""

from __future__ import annotations

import json

import numpy as np
import pytest
from psrv.nn.errors import EvaluationError
from psrv.nn.evaluation import (
    ROC,
    Evaluation,
    EvaluationBinary,
    EvaluationCalibration,
    RegressionEvaluation,
    ROCBinary,
    ROCMultiClass,
    evaluation_from_json,
)
from psrv.nn.torch_io import PerOutput
from sklearn import metrics
from sklearn.calibration import calibration_curve

LABELS = 4


def _multilabel(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random((n, LABELS)) < [0.2, 0.5, 0.7, 0.4]).astype(np.float64)
    p = np.clip(0.35 * y + 0.65 * rng.random((n, LABELS)), 0, 1)  # informative but imperfect
    return y, p


def _halves(make, y, p, mask=None, cut: int = 113):
    a, b, whole = make(), make(), make()
    a.eval(y[:cut], p[:cut], mask=None if mask is None else mask[:cut])
    b.eval(y[cut:], p[cut:], mask=None if mask is None else mask[cut:])
    a.merge(b)
    whole.eval(y, p, mask=mask)
    return a, whole


def _same(a, b) -> None:
    """Two evaluations hold the same counts (float sums equal up to the order of additions)."""
    def walk(x, y, where):
        if isinstance(x, dict):
            assert x.keys() == y.keys(), where
            for key in x:
                walk(x[key], y[key], f"{where}.{key}")
        elif isinstance(x, list) and x and isinstance(x[0], dict):
            assert len(x) == len(y), where
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{where}[{i}]")
        elif isinstance(x, float) or (isinstance(x, list) and not any(isinstance(v, str) for v in x)):
            np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float), rtol=1e-12, atol=1e-12,
                                       err_msg=where)
        else:
            assert x == y, where

    walk(a.to_dict(), b.to_dict(), type(a).__name__)


def _round_trip(evaluation):
    again = evaluation_from_json(evaluation.to_json())
    assert type(again) is type(evaluation)
    assert json.loads(again.to_json()) == json.loads(evaluation.to_json())  # exact, whatever the key order
    return again


# ------------------------------------------------------------------------------------------------
# EvaluationBinary
# ------------------------------------------------------------------------------------------------
def test_evaluation_binary_per_label_equals_sklearn() -> None:
    y, p = _multilabel()
    ev = EvaluationBinary()
    ev.eval(y, p)
    predicted = p >= 0.5
    for i in range(LABELS):
        assert ev.accuracy(i) == pytest.approx(metrics.accuracy_score(y[:, i], predicted[:, i]))
        assert ev.precision(i) == pytest.approx(metrics.precision_score(y[:, i], predicted[:, i]))
        assert ev.recall(i) == pytest.approx(metrics.recall_score(y[:, i], predicted[:, i]))
        assert ev.f1(i) == pytest.approx(metrics.f1_score(y[:, i], predicted[:, i]))
    assert ev.f1() == pytest.approx(metrics.f1_score(y, predicted, average="macro"))
    assert ev.precision() == pytest.approx(metrics.precision_score(y, predicted, average="macro"))


def test_evaluation_binary_per_label_thresholds_and_masks() -> None:
    y, p = _multilabel(seed=1)
    thresholds = [0.3, 0.5, 0.6, 0.8]
    mask = np.random.default_rng(2).random(y.shape) > 0.25  # some labels missing for some examples
    ev = EvaluationBinary(thresholds=thresholds)
    ev.eval(y, p, mask=mask)
    for i, t in enumerate(thresholds):
        keep = mask[:, i]
        assert ev.count(i) == keep.sum()
        expected = metrics.confusion_matrix(y[keep, i], p[keep, i] >= t).ravel()  # tn, fp, fn, tp
        assert [ev.true_negatives(i), ev.false_positives(i), ev.false_negatives(i), ev.true_positives(i)] \
            == expected.tolist()
        assert ev.recall(i) == pytest.approx(metrics.recall_score(y[keep, i], p[keep, i] >= t))


def test_evaluation_binary_merge_equals_whole_and_json_round_trip() -> None:
    y, p = _multilabel(seed=3)
    mask = np.random.default_rng(4).random(y.shape) > 0.1
    merged, whole = _halves(lambda: EvaluationBinary(threshold=0.4, label_names=list("abcd")), y, p, mask)
    _same(merged, whole)
    again = _round_trip(merged)
    assert again.f1(2) == merged.f1(2) and again.label_names == list("abcd")
    with pytest.raises(EvaluationError, match="thresholds differ"):
        merged.merge(EvaluationBinary(threshold=0.5))
    assert "average" in merged.stats()


def test_evaluation_binary_bad_input() -> None:
    ev = EvaluationBinary()
    with pytest.raises(EvaluationError, match="0 or 1"):
        ev.eval(np.full((3, 2), 0.5), np.zeros((3, 2)))
    with pytest.raises(EvaluationError, match="same shape"):
        ev.eval(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(EvaluationError, match="per label"):
        ev.eval(np.zeros((3, 2)), np.zeros((3, 2)), mask=np.ones((3, 3)))
    with pytest.raises(EvaluationError, match="thresholds"):
        EvaluationBinary(num_labels=3, thresholds=[0.5, 0.5])


# ------------------------------------------------------------------------------------------------
# ROCBinary
# ------------------------------------------------------------------------------------------------
def test_roc_binary_equals_sklearn_per_label() -> None:
    y, p = _multilabel(seed=5)
    roc = ROCBinary()
    roc.eval(y, p)
    for i in range(LABELS):
        assert roc.auc(i) == pytest.approx(metrics.roc_auc_score(y[:, i], p[:, i]))
        assert roc.average_precision(i) == pytest.approx(metrics.average_precision_score(y[:, i], p[:, i]))
    assert roc.average_auc() == pytest.approx(metrics.roc_auc_score(y, p, average="macro"))


@pytest.mark.parametrize("steps", [0, 40])
def test_roc_binary_masks_merge_and_json(steps: int) -> None:
    y, p = _multilabel(seed=6)
    mask = np.random.default_rng(7).random(y.shape) > 0.3
    merged, whole = _halves(lambda: ROCBinary(threshold_steps=steps), y, p, mask)
    for i in range(LABELS):
        assert merged.auc(i) == whole.auc(i)
        if steps == 0:
            keep = mask[:, i]
            assert merged.auc(i) == pytest.approx(metrics.roc_auc_score(y[keep, i], p[keep, i]))
    again = _round_trip(merged)
    assert [again.auc(i) for i in range(LABELS)] == [merged.auc(i) for i in range(LABELS)]


# ------------------------------------------------------------------------------------------------
# EvaluationCalibration
# ------------------------------------------------------------------------------------------------
def _probabilities(n: int = 500, classes: int = 3, seed: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    actual = rng.integers(0, classes, n)
    scores = rng.random((n, classes)) + 0.8 * np.eye(classes)[actual]
    return actual, scores / scores.sum(axis=1, keepdims=True)


def test_calibration_reliability_diagram_equals_sklearn() -> None:
    actual, p = _probabilities()
    ev = EvaluationCalibration(reliability_bins=10, histogram_bins=20)
    ev.eval(np.eye(3)[actual], p)
    for c in range(3):
        prob_true, prob_pred = calibration_curve(actual == c, p[:, c], n_bins=10)
        diagram = ev.reliability_diagram(c)
        np.testing.assert_allclose(diagram.fraction_positive, prob_true)
        np.testing.assert_allclose(diagram.mean_predicted, prob_pred)
        counts, edges = ev.probability_histogram(c)
        np.testing.assert_array_equal(counts, np.histogram(p[:, c], bins=20, range=(0, 1))[0])
        members, _ = ev.label_probability_histogram(c)
        np.testing.assert_array_equal(members, np.histogram(p[actual == c, c], bins=20, range=(0, 1))[0])
    np.testing.assert_array_equal(ev.label_counts, np.bincount(actual, minlength=3))
    np.testing.assert_array_equal(ev.prediction_counts, np.bincount(p.argmax(1), minlength=3))
    all_counts, _ = ev.probability_histogram()
    assert all_counts.sum() == p.size


def test_calibration_single_sigmoid_is_two_classes() -> None:
    rng = np.random.default_rng(9)
    y = (rng.random(200) < 0.4).astype(float)
    p = np.clip(0.3 * y + 0.7 * rng.random(200), 0, 1)
    ev = EvaluationCalibration(reliability_bins=5)
    ev.eval(y[:, None], p[:, None])
    prob_true, prob_pred = calibration_curve(y, p, n_bins=5)
    np.testing.assert_allclose(ev.reliability_diagram(1).fraction_positive, prob_true)
    np.testing.assert_allclose(ev.reliability_diagram(1).mean_predicted, prob_pred)


def test_calibration_merge_equals_whole_and_json_round_trip() -> None:
    actual, p = _probabilities(seed=10)
    mask = np.arange(len(actual)) % 4 != 0
    merged, whole = _halves(EvaluationCalibration, actual, p, mask)
    assert merged.num_examples == mask.sum()
    for c in range(3):
        np.testing.assert_allclose(merged.reliability_diagram(c).mean_predicted,
                                   whole.reliability_diagram(c).mean_predicted, rtol=1e-12)
        assert merged.reliability_diagram(c).counts.tolist() == whole.reliability_diagram(c).counts.tolist()
    again = _round_trip(merged)
    assert again.expected_calibration_error(1) == merged.expected_calibration_error(1)
    with pytest.raises(EvaluationError, match="bins differ"):
        merged.merge(EvaluationCalibration(reliability_bins=7))
    with pytest.raises(EvaluationError, match=r"\[0, 1\]"):
        EvaluationCalibration().eval(np.eye(2), np.array([[1.5, -0.5], [0.0, 1.0]]))


# ------------------------------------------------------------------------------------------------
# time series with masks: every kind, one row per unmasked time step
# ------------------------------------------------------------------------------------------------
def _sequences(n: int = 12, steps: int = 9, k: int = 3, seed: int = 11):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, steps + 1, n)
    mask = (np.arange(steps)[None, :] < lengths[:, None]).astype(np.float32)  # (n, T), padded at the end
    actual = rng.integers(0, k, (n, steps))
    scores = rng.random((n, steps, k)) + np.eye(k)[actual]
    probs = scores / scores.sum(axis=2, keepdims=True)
    return actual, probs, mask


TIME_SERIES_KINDS = [
    ("Evaluation", lambda: Evaluation(), "index"),
    ("ROCMultiClass", lambda: ROCMultiClass(), "index"),
    ("EvaluationCalibration", lambda: EvaluationCalibration(), "onehot"),
    ("EvaluationBinary", lambda: EvaluationBinary(), "onehot"),
    ("ROCBinary", lambda: ROCBinary(), "onehot"),
    ("RegressionEvaluation", lambda: RegressionEvaluation(), "onehot"),
]


@pytest.mark.parametrize("name,make,labels", TIME_SERIES_KINDS, ids=[k[0] for k in TIME_SERIES_KINDS])
def test_time_series_with_mask_equals_the_unmasked_steps(name, make, labels) -> None:
    actual, probs, mask = _sequences()
    k = probs.shape[2]
    y = actual if labels == "index" else np.eye(k)[actual]  # (n, T) class indices or (n, T, k)
    series = make()
    series.eval(y, probs, mask=mask)
    keep = mask.reshape(-1) != 0
    rows = make()  # the reference: the same steps, given as plain rows
    rows.eval(y.reshape(-1, *y.shape[2:])[keep], probs.reshape(-1, k)[keep])
    assert json.loads(series.to_json()) == json.loads(rows.to_json())
    first, second = make(), make()  # a time series merges like any batch
    first.eval(y[:5], probs[:5], mask=mask[:5])
    second.eval(y[5:], probs[5:], mask=mask[5:])
    first.merge(second)
    _same(first, series)
    _round_trip(series)


def test_time_series_counts_and_sklearn_on_masked_steps() -> None:
    actual, probs, mask = _sequences(seed=12)
    keep = mask.astype(bool)
    ev = Evaluation()
    ev.eval(actual, probs, mask=mask)
    assert ev.num_examples == keep.sum()
    assert ev.accuracy() == pytest.approx(metrics.accuracy_score(actual[keep], probs.argmax(2)[keep]))
    roc = ROC()
    binary = (actual == 1).astype(float)
    roc.eval(binary[:, :, None], probs[:, :, 1:2], mask=mask[:, :, None])  # (n, T, 1) mask too
    assert roc.auc() == pytest.approx(metrics.roc_auc_score(binary[keep], probs[:, :, 1][keep]))
    regression = RegressionEvaluation()
    regression.eval(binary, probs[:, :, 1:2], mask=mask)  # (n, T) targets of an (n, T, 1) output
    assert regression.mean_squared_error() == pytest.approx(
        metrics.mean_squared_error(binary[keep], probs[:, :, 1][keep]))


def test_time_series_per_label_mask_and_bad_mask() -> None:
    rng = np.random.default_rng(13)
    y = (rng.random((4, 6, 2)) < 0.5).astype(float)
    p = rng.random((4, 6, 2))
    per_label = rng.random((4, 6, 2)) > 0.3
    ev = EvaluationBinary()
    ev.eval(y, p, mask=per_label)
    assert [ev.count(i) for i in range(2)] == per_label.reshape(-1, 2).sum(axis=0).tolist()
    with pytest.raises(EvaluationError, match=r"\(4, 6\)"):
        ev.eval(y, p, mask=np.ones((4, 5)))


# ------------------------------------------------------------------------------------------------
# per output of a network of several outputs
# ------------------------------------------------------------------------------------------------
def test_new_kinds_per_output_merge_and_json() -> None:
    y, p = _multilabel(seed=14)
    actual, probs = _probabilities(n=300, seed=15)

    def make() -> PerOutput:
        return PerOutput([EvaluationBinary(), EvaluationCalibration()])

    a, b, whole = make(), make(), make()
    a.eval([y[:100], actual[:100]], [p[:100], probs[:100]])
    b.eval([y[100:], actual[100:]], [p[100:], probs[100:]])
    whole.eval([y, actual], [p, probs])
    a.merge(b)
    for mine, reference in zip(a, whole, strict=True):
        _same(mine, reference)
        _same(_round_trip(mine), reference)
