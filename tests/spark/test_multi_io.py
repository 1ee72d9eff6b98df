"""A TorchNetwork of two inputs and two outputs on real Spark (local-cluster, 2 executors), from
MultiDataSets: gradient sharing learns (the loss falls) with every task's replica equal to the master
copy, and evaluation and inference return one result per output."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.encoding import AdaptiveThreshold  # noqa: E402
from psrv.nn import MultiDataSet, TorchNetwork  # noqa: E402
from psrv.nn.evaluation import Evaluation, RegressionEvaluation  # noqa: E402
from psrv.spark import SparkNetwork  # noqa: E402
from psrv.spark.config import VoidConfiguration  # noqa: E402
from psrv.spark.driver.shared_training import SharedTrainingMaster  # noqa: E402
from psrv.spark.errors import SparkInputError  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


class TwoInTwoOut(torch.nn.Module):
    """Digits' 8x8 image split in two halves (two inputs); outputs: the digit (10 logits) and the
    image's mean intensity of each half (2 regression values)."""

    def __init__(self) -> None:
        super().__init__()
        self.top = torch.nn.Linear(32, 32)
        self.bottom = torch.nn.Linear(32, 32)
        self.digit = torch.nn.Linear(64, 10)
        self.means = torch.nn.Linear(64, 2)

    def forward(self, top, bottom):
        h = torch.relu(torch.cat([self.top(top), self.bottom(bottom)], dim=1))
        return self.digit(h), self.means(h)


def _network() -> TorchNetwork:
    torch.manual_seed(11)
    return TorchNetwork(TwoInTwoOut(), [torch.nn.CrossEntropyLoss(), torch.nn.MSELoss()],
                        input_shape=[(32,), (32,)], output_activation=["softmax", None], seed=11,
                        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2))


def _multi(dataset) -> MultiDataSet:
    x = dataset.features
    means = np.stack([x[:, :32].mean(axis=1), x[:, 32:].mean(axis=1)], axis=1).astype(np.float32)
    return MultiDataSet([x[:, :32], x[:, 32:]], [dataset.labels, means])


def _batches(dataset, size: int) -> list[MultiDataSet]:
    multi = _multi(dataset)
    return [multi.subset(slice(i, i + size)) for i in range(0, multi.num_examples, size)]


def test_two_inputs_two_outputs_trained_evaluated_and_run_on_spark(spark_context, digits) -> None:
    train, test = digits
    network = _network()
    test_multi = _multi(test)
    loss_before = network.score(test_multi)
    conf = VoidConfiguration(unicast_port=0, mesh_build_mode="plain", heartbeat_ms=500,
                             join_timeout_ms=120_000)  # executors import torch first: slow on a busy host
    master = SharedTrainingMaster(conf, batch_size_per_worker=16, rdd_training_approach="export",
                                  threshold_algorithm=AdaptiveThreshold(3e-2))
    spark_net = SparkNetwork(spark_context, network, master)
    rdd = spark_context.parallelize(_batches(train, 50), 2)
    replicas = 0
    for _ in range(3):
        spark_net.fit(rdd)
        fit = master.last_fit
        # the central invariant, every epoch: each task's final replica equals the master copy
        assert fit["replicas_diverged"] == 0 and fit["updates_missing"] == 0, fit
        assert fit["examples"] == train.num_examples, fit
        replicas += fit["replicas_checked"]
    assert replicas > 0
    loss_after = network.score(test_multi)
    assert loss_after < 0.5 * loss_before, (loss_before, loss_after)

    # evaluation from MultiDataSets, distributed: one result per output, equal to the local evaluation
    test_rdd = spark_context.parallelize(_batches(test, 40), 2)
    result = spark_net.evaluate(test_rdd)
    assert isinstance(result, list) and len(result) == 2
    assert isinstance(result[0], Evaluation) and isinstance(result[1], RegressionEvaluation)
    local = network.evaluate(test_multi)
    np.testing.assert_array_equal(result[0].confusion_matrix(), local[0].confusion_matrix())
    np.testing.assert_allclose(result[1].mean_squared_error(), local[1].mean_squared_error(), rtol=1e-5)
    assert result[0].accuracy() >= 0.8, result[0].accuracy()

    # inference from MultiDataSets: per element, a list of one array per output, equal to local output
    outputs = spark_net.output(test_rdd).collect()
    assert len(outputs) == len(_batches(test, 40))
    expected = network.output(test_multi.features)
    np.testing.assert_allclose(np.concatenate([o[0] for o in outputs]), expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([o[1] for o in outputs]), expected[1], rtol=1e-5, atol=1e-6)

    # feed-forward with keys: a value is a list of one example per input
    pairs = [(i, [test_multi.features[0][i], test_multi.features[1][i]]) for i in range(20)]
    keyed = dict(spark_net.feed_forward_with_key(spark_context.parallelize(pairs, 2), batch_size=7).collect())
    assert sorted(keyed) == list(range(20))
    for i, prediction in keyed.items():
        assert isinstance(prediction, list) and len(prediction) == 2
        np.testing.assert_allclose(prediction[0], expected[0][i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(prediction[1], expected[1][i], rtol=1e-5, atol=1e-6)


def test_data_that_does_not_fit_the_inputs_fails_on_the_driver(spark_context, digits) -> None:
    train, _ = digits
    network = _network()
    master = SharedTrainingMaster(VoidConfiguration(unicast_port=0), batch_size_per_worker=16)
    spark_net = SparkNetwork(spark_context, network, master)
    single = spark_context.parallelize(list(train.batches(50))[:4], 2)  # DataSets: one input, one output
    with pytest.raises(SparkInputError, match=r"1 feature and 1 label arrays .* takes 2 input\(s\)"):
        spark_net.fit(single)
    wrong = [MultiDataSet([b.features[0][:, :30], b.features[1]], b.labels) for b in _batches(train, 50)[:4]]
    with pytest.raises(SparkInputError, match=r"features\[0\] .* input_shape\[0\] is \(32,\)"):
        spark_net.fit(spark_context.parallelize(wrong, 2))


def _frame(spark, dataset):
    """Digits as a DataFrame: input 0 an array column, input 1 a group (a number + an array column),
    output 0 a class index column, output 1 an array column."""
    multi = _multi(dataset)
    top, bottom = multi.features
    rows = [(top[i].tolist(), float(bottom[i, 0]), bottom[i, 1:].tolist(), int(multi.labels[0][i].argmax()),
             multi.labels[1][i].tolist()) for i in range(multi.num_examples)]
    return spark.createDataFrame(rows, ["top", "b_first", "b_rest", "digit", "means"]), multi


def test_a_dataframe_with_several_feature_column_groups(spark, spark_context, digits) -> None:
    train, test = digits
    train_df, _ = _frame(spark, train)
    test_df, test_multi = _frame(spark, test)
    network = _network()
    loss_before = network.score(test_multi)
    conf = VoidConfiguration(unicast_port=0, mesh_build_mode="plain", heartbeat_ms=500,
                             join_timeout_ms=120_000)
    master = SharedTrainingMaster(conf, batch_size_per_worker=16, rdd_training_approach="export",
                                  threshold_algorithm=AdaptiveThreshold(3e-2))
    spark_net = SparkNetwork(spark_context, network, master, features_col=["top", ("b_first", "b_rest")],
                             label_col=["digit", "means"])
    spark_net.fit(train_df, epochs=2, validation_data=test_df)
    fit = master.last_fit
    last = spark_net.history[-1].metrics  # validation per output: the first output's, then each output's
    assert last["val_accuracy"] == last["val_out0_accuracy"] and "val_out1_mse" in last, last
    assert fit["replicas_diverged"] == 0 and fit["replicas_checked"] > 0, fit
    assert network.score(test_multi) < 0.5 * loss_before
    result = spark_net.evaluate(test_df)
    local = network.evaluate(test_multi)
    assert len(result) == 2
    np.testing.assert_array_equal(result[0].confusion_matrix(), local[0].confusion_matrix())
    np.testing.assert_allclose(result[1].mean_squared_error(), local[1].mean_squared_error(), rtol=1e-5)
    wrong = SparkNetwork(spark_context, network, master, features_col=["top", "bottom"],
                         label_col=["digit", "means"])
    with pytest.raises(SparkInputError, match=r"no column\(s\) \['bottom'\] \(features_col="):
        wrong.fit(train_df)


def test_parameter_averaging_from_multidatasets(spark_context, digits) -> None:
    from psrv.spark import ParameterAveragingTrainingMaster

    train, test = digits
    network = _network()
    test_multi = _multi(test)
    loss_before = network.score(test_multi)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=5,
                                              rdd_training_approach="export")
    SparkNetwork(spark_context, network, master).fit(spark_context.parallelize(_batches(train, 50), 2))
    assert network.score(test_multi) < 0.5 * loss_before
