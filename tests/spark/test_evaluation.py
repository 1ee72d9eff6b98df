"""Distributed evaluation and inference equal local evaluation and output of the same network."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet
from psrv.nn.evaluation import ROC, Evaluation, RegressionEvaluation, ROCMultiClass
from psrv.spark import SparkNetwork
from psrv.spark.errors import EvaluationFileError, SparkConfigError, SparkInputError

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]


def chunks(dataset: DataSet, size: int) -> list[DataSet]:
    """A DataSet cut into pieces of ``size`` examples (what an RDD of DataSets typically holds)."""
    return list(dataset.batches(size))


@pytest.fixture(scope="module")
def trained(digits):
    train, _ = digits
    net = Network([Dense(32, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2), seed=3)
    net.fit(train, epochs=1, batch_size=32)
    return net


@pytest.fixture(scope="module")
def test_rdd(spark_context, digits):
    _, test = digits
    return spark_context.parallelize(chunks(test, 10), 3)


def test_evaluate_equals_local(spark_context, trained, digits, test_rdd) -> None:
    _, test = digits
    local = trained.evaluate(test)
    remote = SparkNetwork(spark_context, trained).evaluate(test_rdd, batch_size=16)
    assert np.array_equal(remote.confusion_matrix(), local.confusion_matrix())
    assert remote.confusion_matrix().sum() == test.num_examples
    assert remote.accuracy() == pytest.approx(local.accuracy(), abs=0)


def test_several_evaluations_in_one_pass(spark_context, trained, digits, test_rdd) -> None:
    _, test = digits
    templates = [Evaluation(num_classes=10), ROCMultiClass()]
    evaluation, roc = SparkNetwork(spark_context, trained).do_evaluation(test_rdd, 7, templates)
    assert np.array_equal(evaluation.confusion_matrix(), trained.evaluate(test).confusion_matrix())
    local_roc = trained.evaluate(test, ROCMultiClass())
    for cls in range(10):
        assert abs(roc.auc(cls) - local_roc.auc(cls)) <= 1e-9
    assert templates[0].confusion_matrix().sum() == 0  # the templates are left untouched


def test_binary_roc_equals_local(spark_context, digits) -> None:
    train, test = digits
    def binary(data: DataSet) -> DataSet:  # "is it a 3?"
        return DataSet(data.features, (data.label_indices() == 3).astype(np.float32).reshape(-1, 1))

    net = Network([Dense(16, activation="relu"), Output(1, activation="sigmoid")], input_shape=(64,),
                  updater=Adam(1e-2), seed=5)
    net.fit(binary(train), epochs=1, batch_size=32)
    rdd = spark_context.parallelize(chunks(binary(test), 25), 4)
    remote = SparkNetwork(spark_context, net).evaluate_roc(rdd)
    local = net.evaluate(binary(test), ROC())
    assert remote.auc() > 0.5
    assert abs(remote.auc() - local.auc()) <= 1e-9
    accuracy = SparkNetwork(spark_context, net).evaluate(rdd)
    assert np.array_equal(accuracy.confusion_matrix(), net.evaluate(binary(test)).confusion_matrix())


def test_regression_equals_local(spark_context) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = np.stack([x[:, 0] - 2 * x[:, 1], x[:, 2] * x[:, 3]], axis=1).astype(np.float32)
    data = DataSet(x, y)
    layers = [Dense(8, activation="tanh"), Output(2, activation="identity", loss="mse")]
    net = Network(layers, input_shape=(4,), updater=Adam(1e-2), seed=1)
    net.fit(data, epochs=2, batch_size=32)
    rdd = spark_context.parallelize(chunks(data, 40), 3)
    remote = SparkNetwork(spark_context, net).evaluate_regression(rdd)
    local = net.evaluate(data, RegressionEvaluation())
    assert remote.to_json() != RegressionEvaluation().to_json()
    for column in range(2):
        assert remote.mean_squared_error(column) == pytest.approx(local.mean_squared_error(column), rel=1e-9)
    default = SparkNetwork(spark_context, net).evaluate(rdd)  # an MSE output gets regression metrics
    assert isinstance(default, RegressionEvaluation)
    assert default.mean_squared_error(0) == pytest.approx(local.mean_squared_error(0), rel=1e-9)


class PrefixedLoader:
    """A custom loader: files written as .npz archives."""

    def load(self, path: str) -> DataSet:
        with np.load(path) as archive:
            return DataSet(archive["x"], archive["y"])


def test_evaluate_paths_with_custom_loader(spark_context, trained, digits, tmp_path) -> None:
    _, test = digits
    paths = []
    for i, batch in enumerate(chunks(test, 50)):
        path = str(tmp_path / f"batch-{i}.npz")
        np.savez(path, x=batch.features, y=batch.labels)
        paths.append(path)
    remote = SparkNetwork(spark_context, trained).evaluate_paths(
        spark_context.parallelize(paths, 2), loader=PrefixedLoader()
    )
    assert np.array_equal(remote.confusion_matrix(), trained.evaluate(test).confusion_matrix())


def test_feed_forward_with_key_returns_every_key(spark_context, trained, digits) -> None:
    _, test = digits
    pairs = [(f"id-{i}", test.features[i]) for i in range(test.num_examples)]
    result = dict(SparkNetwork(spark_context, trained).feed_forward_with_key(
        spark_context.parallelize(pairs, 3), batch_size=32).collect())
    assert sorted(result) == sorted(key for key, _ in pairs)
    local = trained.output(test.features)
    remote = np.stack([result[f"id-{i}"] for i in range(test.num_examples)])
    np.testing.assert_allclose(remote, local, rtol=0, atol=1e-6)


def test_feed_forward_with_masks(spark_context, trained, digits) -> None:
    _, test = digits
    pairs = [(i, (test.features[i], np.float32(i % 2))) for i in range(20)]
    pairs += [(100 + i, test.features[i]) for i in range(5)]
    result = dict(SparkNetwork(spark_context, trained).feed_forward_with_key(
        spark_context.parallelize(pairs, 2), batch_size=8).collect())
    assert len(result) == 25
    local = trained.output(test.features[:20])
    for i in range(20):
        expected = local[i] if i % 2 else np.zeros(10, np.float32)
        np.testing.assert_allclose(result[i], expected, atol=1e-6)
    np.testing.assert_allclose(np.stack([result[100 + i] for i in range(5)]), local[:5], atol=1e-6)


def test_evaluations_saved_and_read_back(spark_context, trained, test_rdd, tmp_path) -> None:
    spark_net = SparkNetwork(spark_context, trained)
    evaluation, roc = spark_net.do_evaluation(test_rdd, 32, [Evaluation(10), ROCMultiClass()])
    for path in (str(tmp_path / "local" / "results.json"), (tmp_path / "uri.json").as_uri()):
        spark_net.save_evaluations([evaluation, roc], path)
        loaded_evaluation, loaded_roc = spark_net.load_evaluations(path)
        assert np.array_equal(loaded_evaluation.confusion_matrix(), evaluation.confusion_matrix())
        assert loaded_roc.auc(4) == roc.auc(4)
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(EvaluationFileError, match="not a psrv-evaluations file"):
        spark_net.load_evaluations(str(tmp_path / "bad.json"))


def test_no_training_master_is_a_clear_error(spark_context, trained, test_rdd) -> None:
    with pytest.raises(SparkConfigError, match="no training master"):
        SparkNetwork(spark_context, trained).fit(test_rdd)


def test_torch_network_evaluated_and_run_on_spark(spark_context, digits) -> None:
    torch = pytest.importorskip("torch")
    from psrv.nn import TorchNetwork

    train, test = digits
    module = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    net = TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,), seed=4)
    net.fit(train, epochs=2, batch_size=32)
    spark_net = SparkNetwork(spark_context, net)
    remote = spark_net.evaluate(spark_context.parallelize(chunks(test, 30), 2))
    assert np.array_equal(remote.confusion_matrix(), net.evaluate(test).confusion_matrix())
    pairs = spark_context.parallelize([(i, test.features[i]) for i in range(40)], 2)
    result = dict(spark_net.feed_forward_with_key(pairs, batch_size=16).collect())
    np.testing.assert_allclose(np.stack([result[i] for i in range(40)]), net.output(test.features[:40]),
                               atol=1e-6)


def test_dataframe_with_ml_vectors_evaluates_like_local(spark, spark_context, trained, digits) -> None:
    from pyspark.ml.linalg import Vectors

    _, test = digits
    labels = test.label_indices()
    rows = [(Vectors.dense(test.features[i].tolist()), int(labels[i])) for i in range(test.num_examples)]
    frame = spark.createDataFrame(rows, ["pixels", "digit"])
    spark_net = SparkNetwork(spark, trained, features_col="pixels", label_col="digit")
    remote = spark_net.evaluate(frame)
    assert np.array_equal(remote.confusion_matrix(), trained.evaluate(test).confusion_matrix())
    with pytest.raises(SparkInputError, match="has no column"):
        SparkNetwork(spark, trained).evaluate(frame)
