"""Validation metrics without Spark: the estimators' macro precision/recall/F1 from confusion counts
(against scikit-learn on the same rows), the mean loss merged like an evaluation (against the network's
own score over all rows), and one epoch's metrics reaching the loggers and the report's records."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from psrv.nn import Dense, Network, Output, Sgd
from psrv.nn.data import DataSet
from psrv.spark.ml.validation import class_metrics
from psrv.spark.observe.metrics import publish_validation
from psrv.spark.task.inference import MeanLoss


def test_macro_precision_recall_f1_from_counts_equal_scikit_learns() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 4, 300)
    predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 3, 300))  # class 3 never predicted
    pairs = Counter(zip(labels.tolist(), predictions.tolist(), strict=True))
    counts = [(y, p, n) for (y, p), n in pairs.items()]
    found = class_metrics(counts, classes=5)  # a fifth class neither seen nor predicted counts as 0
    every = list(range(5))
    assert found["val_accuracy"] == pytest.approx(metrics.accuracy_score(labels, predictions))
    for name, reference in (("precision", metrics.precision_score), ("recall", metrics.recall_score),
                            ("f1", metrics.f1_score)):
        expected = reference(labels, predictions, average="macro", labels=every, zero_division=0)
        assert found[f"val_{name}"] == pytest.approx(expected), name
    assert class_metrics([]) == {}


def test_mean_loss_merged_over_parts_is_the_networks_score_over_all_rows() -> None:
    rng = np.random.default_rng(1)
    network = Network([Dense(6, activation="relu"), Output(3)], input_shape=(5,), updater=Sgd(0.1), seed=3)
    x = rng.normal(size=(70, 5)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 70)]
    parts = [MeanLoss(), MeanLoss()]
    for index, (start, stop) in enumerate([(0, 30), (30, 55), (55, 70)]):
        parts[index % 2].eval_network(network, DataSet(x[start:stop], y[start:stop]))
    parts[0].merge(parts[1])
    assert parts[0].count == 70
    assert parts[0].value() == pytest.approx(network.score(DataSet(x, y)), rel=1e-6)
    assert np.isnan(MeanLoss().value())


def test_an_epochs_validation_metrics_reach_the_loggers_and_the_reports_records() -> None:
    class Sink:
        calls: list = []

        def on_metrics(self, step, epoch, metrics):
            self.calls.append((step, epoch, dict(metrics)))

    master = SimpleNamespace(loggers=[Sink()], collect_training_stats=True, training_stats=[])
    sent = publish_validation(master, SimpleNamespace(iteration=40), 2,
                              {"loss": 0.3, "val_loss": 0.4, "val_f1": 0.8, "val_r2": float("nan")})
    assert sent == {"loss": 0.4, "f1": 0.8}  # val_* only, finite only, without the prefix
    assert master.loggers[0].calls == [(40, 2, {"validation/loss": 0.4, "validation/f1": 0.8})]
    (record,) = master.training_stats
    assert record["kind"] == "validation" and record["epoch"] == 2 and record["f1"] == 0.8


def test_mean_loss_runs_beside_an_evaluation_in_one_partitions_pass() -> None:
    """What an evaluation job's task does with the templates the validation gives it (no Spark)."""
    from psrv.nn.evaluation import Evaluation
    from psrv.spark.driver.evaluation import do_evaluation
    from psrv.spark.payload import NetworkPayload
    from psrv.spark.task.inference import PartitionEvaluator

    rng = np.random.default_rng(2)
    network = Network([Dense(6, activation="relu"), Output(3)], input_shape=(5,), updater=Sgd(0.1), seed=4)
    x = rng.normal(size=(40, 5)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 40)]
    payload = SimpleNamespace(value=NetworkPayload.from_network(network))
    task = PartitionEvaluator(payload, [Evaluation(3), MeanLoss()], batch_size=16, loader=None, prefetch=0)
    evaluation, loss = next(task(iter([DataSet(x[:25], y[:25]), DataSet(x[25:], y[25:])])))
    assert evaluation.accuracy() == pytest.approx(network.evaluate(DataSet(x, y)).accuracy())
    assert loss.count == 40 and loss.value() == pytest.approx(network.score(DataSet(x, y)), rel=1e-6)
    broadcasts = []
    context = SimpleNamespace(broadcast=lambda value: broadcasts.append(value) or SimpleNamespace(
        value=value, unpersist=lambda: None))
    rdd = SimpleNamespace(mapPartitions=lambda fn: SimpleNamespace(
        treeAggregate=lambda zero, seq, comb, depth: None))
    merged = do_evaluation(context, payload.value, rdd, 16, [Evaluation(3), MeanLoss()])  # accepted
    assert broadcasts and np.isnan(merged[1].value())  # no partition: the templates, unevaluated
