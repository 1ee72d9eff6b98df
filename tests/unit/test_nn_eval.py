"""Evaluations against scikit-learn on the same predictions; merge equals the union; JSON round trips."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.nn.errors import EvaluationError
from psrv.nn.evaluation import ROC, Evaluation, RegressionEvaluation, ROCMultiClass, evaluation_from_json
from sklearn import metrics

CLASSES = 5


def _classification(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    actual = rng.integers(0, CLASSES, n)
    scores = rng.random((n, CLASSES))
    scores[np.arange(n), actual] += rng.random(n) * 1.2  # informative but imperfect
    return actual, scores / scores.sum(axis=1, keepdims=True)


def _split_eval(make, labels, predictions, cut: int):
    """(merged result of two halves, result of one pass over the union)."""
    a, b, whole = make(), make(), make()
    a.eval(labels[:cut], predictions[:cut])
    b.eval(labels[cut:], predictions[cut:])
    a.merge(b)
    whole.eval(labels, predictions)
    return a, whole


# ------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------
def test_classification_metrics_equal_sklearn() -> None:
    actual, probs = _classification()
    predicted = probs.argmax(axis=1)
    ev = Evaluation(top_n=3)
    ev.eval(np.eye(CLASSES)[actual], probs)
    labels = list(range(CLASSES))
    assert ev.accuracy() == pytest.approx(metrics.accuracy_score(actual, predicted), abs=1e-12)
    for average in ("macro", "micro"):
        kw = {"labels": labels, "average": average, "zero_division": 0}
        assert ev.precision(average=average) == pytest.approx(
            metrics.precision_score(actual, predicted, **kw)
        )
        assert ev.recall(average=average) == pytest.approx(metrics.recall_score(actual, predicted, **kw))
        assert ev.f1(average=average) == pytest.approx(metrics.f1_score(actual, predicted, **kw))
    per_class = {"labels": labels, "average": None, "zero_division": 0}
    np.testing.assert_allclose(
        [ev.precision(c) for c in labels], metrics.precision_score(actual, predicted, **per_class)
    )
    np.testing.assert_allclose(
        [ev.recall(c) for c in labels], metrics.recall_score(actual, predicted, **per_class)
    )
    np.testing.assert_allclose([ev.f1(c) for c in labels], metrics.f1_score(actual, predicted, **per_class))
    np.testing.assert_array_equal(
        ev.confusion_matrix(), metrics.confusion_matrix(actual, predicted, labels=labels)
    )
    assert ev.top_n_accuracy() == pytest.approx(
        metrics.top_k_accuracy_score(actual, probs, k=3, labels=labels)
    )
    assert ev.num_examples == 400
    assert ev.class_count(2) == int((actual == 2).sum())


def test_class_never_predicted_counts_as_zero_like_sklearn() -> None:
    actual = np.array([0, 1, 2, 2])
    predicted = np.array([0, 1, 1, 1])
    ev = Evaluation(num_classes=3)
    ev.eval(actual, predicted)
    kw = {"labels": [0, 1, 2], "average": "macro", "zero_division": 0}
    assert ev.precision() == pytest.approx(metrics.precision_score(actual, predicted, **kw))
    assert ev.f1() == pytest.approx(metrics.f1_score(actual, predicted, **kw))
    assert ev.precision(2) == 0.0


def test_masked_rows_and_sequences_are_skipped() -> None:
    actual, probs = _classification(60)
    mask = np.arange(60) % 3 != 0
    ev = Evaluation()
    ev.eval(actual, probs, mask=mask)
    np.testing.assert_array_equal(
        ev.confusion_matrix(),
        metrics.confusion_matrix(actual[mask], probs[mask].argmax(1), labels=list(range(CLASSES))),
    )
    seq = Evaluation()
    seq.eval(
        np.eye(CLASSES)[actual].reshape(6, 10, CLASSES), probs.reshape(6, 10, CLASSES), mask.reshape(6, 10)
    )
    np.testing.assert_array_equal(seq.confusion_matrix(), ev.confusion_matrix())


def test_evaluation_merge_equals_union_and_json_round_trip() -> None:
    actual, probs = _classification()
    merged, whole = _split_eval(lambda: Evaluation(top_n=2), actual, probs, 137)
    np.testing.assert_array_equal(merged.confusion_matrix(), whole.confusion_matrix())
    assert merged.top_n_accuracy() == whole.top_n_accuracy()
    empty = Evaluation(top_n=2)
    empty.merge(whole)  # an empty evaluation adopts the class count
    np.testing.assert_array_equal(empty.confusion_matrix(), whole.confusion_matrix())
    again = Evaluation.from_json(whole.to_json())
    np.testing.assert_array_equal(again.confusion_matrix(), whole.confusion_matrix())
    assert again.top_n_accuracy() == whole.top_n_accuracy()
    assert again.stats() == whole.stats()
    assert isinstance(evaluation_from_json(whole.to_json()), Evaluation)


def test_evaluation_stats_is_readable() -> None:
    ev = Evaluation(class_names=["cat", "dog", "emu"])
    ev.eval(np.array([0, 1, 2, 2]), np.eye(3)[[0, 1, 2, 0]])
    text = ev.stats()
    assert "Accuracy:            0.7500" in text
    assert "emu" in text and "Confusion matrix" in text
    assert "no examples" in Evaluation().stats()


def test_evaluation_bad_input() -> None:
    ev = Evaluation()
    with pytest.raises(EvaluationError, match="same number of rows"):
        ev.eval(np.eye(3), np.eye(3)[:2])
    with pytest.raises(EvaluationError, match="same number of classes"):
        ev.eval(np.eye(3), np.ones((3, 4)))
    with pytest.raises(EvaluationError, match="NaN"):
        ev.eval(np.eye(2), np.array([[np.nan, 1.0], [0.0, 1.0]]))
    with pytest.raises(EvaluationError, match=r"\[0, 3\)"):
        ev.eval(np.array([0, 7]), np.ones((2, 3)))
    with pytest.raises(EvaluationError, match="num_classes: unknown"):
        ev.eval(np.array([0, 1]), np.array([1, 0]))
    with pytest.raises(EvaluationError, match="no examples"):
        ev.accuracy()
    ev.eval(np.eye(3), np.eye(3))
    with pytest.raises(EvaluationError, match="expected 3 classes"):
        ev.eval(np.eye(4), np.eye(4))
    with pytest.raises(EvaluationError, match="top_n differs"):
        ev.merge(Evaluation(top_n=2))
    with pytest.raises(EvaluationError, match="type 'Evaluation'"):
        Evaluation.from_json(ROC().to_json())
    with pytest.raises(EvaluationError, match="not valid JSON"):
        Evaluation.from_json("{oops")


# ------------------------------------------------------------------------------------------------
# ROC
# ------------------------------------------------------------------------------------------------
def _binary(n: int = 300, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(rng.random(n) * 0.7 + y * 0.3, 0, 1)
    p = np.round(p, 2)  # ties, as thresholded probabilities produce
    return y, p


def test_exact_roc_equals_sklearn() -> None:
    y, p = _binary()
    roc = ROC()
    roc.eval(y, p)
    assert roc.auc() == pytest.approx(metrics.roc_auc_score(y, p), abs=1e-12)
    assert roc.average_precision() == pytest.approx(metrics.average_precision_score(y, p), abs=1e-12)
    fpr, tpr, _ = roc.roc_curve()
    sk_fpr, sk_tpr, _ = metrics.roc_curve(y, p, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)
    two_columns = ROC()
    two_columns.eval(np.eye(2)[y], np.column_stack([1 - p, p]))
    assert two_columns.auc() == roc.auc()


def test_thresholded_roc_is_close_and_exact_on_grid_values() -> None:
    y, p = _binary()  # scores on a 0.01 grid: 100 steps resolve every distinct score
    exact = metrics.roc_auc_score(y, p)
    fine = ROC(threshold_steps=100)
    fine.eval(y, p)
    assert fine.auc() == pytest.approx(exact, abs=1e-9)
    coarse = ROC(threshold_steps=10)
    coarse.eval(y, p)
    assert coarse.auc() == pytest.approx(exact, abs=0.03)
    assert coarse.num_positives == int(y.sum()) and coarse.num_negatives == int((1 - y).sum())


@pytest.mark.parametrize("steps", [0, 20])
def test_roc_merge_equals_union_and_json(steps: int) -> None:
    y, p = _binary()
    merged, whole = _split_eval(lambda: ROC(steps), y, p, 101)
    assert merged.auc() == pytest.approx(whole.auc(), abs=1e-12)
    again = ROC.from_json(merged.to_json())
    assert again.auc() == pytest.approx(whole.auc(), abs=1e-12)
    assert again.threshold_steps == steps
    assert "AUC" in again.stats()


def test_roc_bad_input() -> None:
    roc = ROC()
    with pytest.raises(EvaluationError, match="binary labels"):
        roc.eval(np.array([0, 2]), np.array([0.1, 0.2]))
    with pytest.raises(EvaluationError, match=r"\(n, 2\)"):
        roc.eval(np.zeros((2, 3)), np.zeros((2, 3)))
    roc.eval(np.array([1, 1]), np.array([0.3, 0.9]))
    with pytest.raises(EvaluationError, match="need both classes"):
        roc.auc()
    with pytest.raises(EvaluationError, match="threshold_steps differ"):
        roc.merge(ROC(5))
    with pytest.raises(EvaluationError, match="threshold_steps"):
        ROC(-1)


def test_roc_multiclass_equals_sklearn_one_vs_rest() -> None:
    actual, probs = _classification()
    roc = ROCMultiClass()
    roc.eval(np.eye(CLASSES)[actual], probs)
    for c in range(CLASSES):
        assert roc.auc(c) == pytest.approx(metrics.roc_auc_score(actual == c, probs[:, c]), abs=1e-12)
    assert roc.average_auc() == pytest.approx(
        metrics.roc_auc_score(actual, probs, multi_class="ovr", average="macro"), abs=1e-12
    )


@pytest.mark.parametrize("steps", [0, 30])
def test_roc_multiclass_merge_and_json(steps: int) -> None:
    actual, probs = _classification()
    merged, whole = _split_eval(lambda: ROCMultiClass(steps), actual, probs, 250)
    again = ROCMultiClass.from_json(merged.to_json())
    for c in range(CLASSES):
        assert again.auc(c) == pytest.approx(whole.auc(c), abs=1e-12)
    assert isinstance(evaluation_from_json(again.to_json()), ROCMultiClass)
    assert "one-vs-all" in again.stats()
    with pytest.raises(EvaluationError, match="class index"):
        again.auc(CLASSES)


# ------------------------------------------------------------------------------------------------
# regression
# ------------------------------------------------------------------------------------------------
def _regression(n: int = 250, k: int = 3, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.standard_normal((n, k)) * [1, 5, 0.2] + [0, 10, -3]
    return y, y + rng.standard_normal((n, k)) * [0.3, 2, 0.1]


def test_regression_metrics_equal_sklearn() -> None:
    y, p = _regression()
    ev = RegressionEvaluation(column_names=["a", "b", "c"])
    ev.eval(y, p)
    for c in range(3):
        assert ev.mean_squared_error(c) == pytest.approx(metrics.mean_squared_error(y[:, c], p[:, c]))
        assert ev.mean_absolute_error(c) == pytest.approx(metrics.mean_absolute_error(y[:, c], p[:, c]))
        assert ev.root_mean_squared_error(c) == pytest.approx(
            metrics.root_mean_squared_error(y[:, c], p[:, c])
        )
        assert ev.r_squared(c) == pytest.approx(metrics.r2_score(y[:, c], p[:, c]))
        assert ev.pearson_correlation(c) == pytest.approx(np.corrcoef(y[:, c], p[:, c])[0, 1])
    assert ev.mean_squared_error() == pytest.approx(metrics.mean_squared_error(y, p))
    assert ev.root_mean_squared_error() == pytest.approx(metrics.root_mean_squared_error(y, p))
    assert ev.r_squared() == pytest.approx(metrics.r2_score(y, p))


def test_regression_merge_equals_union_and_json() -> None:
    y, p = _regression()
    merged, whole = _split_eval(RegressionEvaluation, y, p, 17)
    again = RegressionEvaluation.from_json(merged.to_json())
    for name in ("mean_squared_error", "mean_absolute_error", "r_squared", "pearson_correlation"):
        for c in range(3):
            assert getattr(again, name)(c) == pytest.approx(getattr(whole, name)(c), rel=1e-12)
    assert "R^2" in again.stats() and "average" in again.stats()


def test_regression_per_column_mask() -> None:
    y, p = _regression(40)
    mask = np.ones_like(y)
    mask[::2, 1] = 0
    ev = RegressionEvaluation()
    ev.eval(y, p, mask=mask)
    assert ev.mean_squared_error(1) == pytest.approx(metrics.mean_squared_error(y[1::2, 1], p[1::2, 1]))
    assert ev.mean_squared_error(0) == pytest.approx(metrics.mean_squared_error(y[:, 0], p[:, 0]))


def test_regression_bad_input() -> None:
    ev = RegressionEvaluation()
    with pytest.raises(EvaluationError, match="same shape"):
        ev.eval(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(EvaluationError, match="no examples"):
        ev.r_squared()
    with pytest.raises(EvaluationError, match="infinity"):
        ev.eval(np.zeros((1, 1)), np.array([[np.inf]]))
    ev.eval(np.zeros((3, 2)), np.ones((3, 2)))
    with pytest.raises(EvaluationError, match="expected 2 columns"):
        ev.merge(RegressionEvaluation(num_columns=3))
    with pytest.raises(EvaluationError, match="unknown evaluation type"):
        evaluation_from_json('{"type": "Nope"}')
