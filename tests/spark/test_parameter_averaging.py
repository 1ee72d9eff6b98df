"""Parameter averaging on real Spark (2 executors): accuracy, both approaches, inputs, stats."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet
from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork
from psrv.spark.errors import SparkConfigError, SparkInputError
from psrv.spark.observe.stats import normalize_stats

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def _network(seed: int = 11) -> Network:
    layers = [Dense(64, activation="relu"), Output(10)]
    return Network(layers, input_shape=(64,), updater=Adam(1e-2), seed=seed)


def _rdd(spark_context, data: DataSet, piece: int, partitions: int):
    return spark_context.parallelize(list(data.batches(piece)), partitions)


def test_export_approach_reaches_accuracy_and_records_stats(spark_context, digits, tmp_path) -> None:
    train, test = digits
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=5,
                                              export_directory=str(tmp_path), collect_training_stats=True)
    net = _network()
    before = net.params.copy()
    spark_net = SparkNetwork(spark_context, net, master)
    rdd = _rdd(spark_context, train, 50, 3)
    for _ in range(3):
        assert spark_net.fit(rdd) is net
    assert not np.array_equal(before, net.params)
    accuracy = net.evaluate(test).accuracy()
    assert accuracy >= 0.90, accuracy
    assert net.epoch == 3
    # every example was used once per epoch: ceil(n/16) minibatches per epoch, freq steps per round
    stats = normalize_stats(spark_net.get_training_stats())
    fits = [s for s in stats if s["kind"] == "fit"]
    assert sum(s["examples"] for s in fits) == 3 * train.num_examples
    assert len({s["worker"] for s in fits}) >= 2  # two executors (a Python worker may be replaced)
    rounds = [s for s in stats if s["kind"] == "averaging"]
    assert len(rounds) == 3 * int(np.ceil(np.ceil(train.num_examples / 16) / 10))
    # the driver's iteration grows by the longest worker share of each round
    minibatches = int(np.ceil(train.num_examples / 16))
    full, rest = divmod(minibatches, 10)
    assert net.iteration == 3 * (full * 5 + (int(np.ceil(rest / min(2, rest))) if rest else 0))
    assert spark_net.get_score() is not None and spark_net.get_score() < 1.0
    # the data was exported once (into the user's export_directory) and reused by the later fits;
    # files under a user-given export_directory are kept, also after close()
    exports = list(tmp_path.iterdir())
    assert len(exports) == 1 and len(fits) == 3 * len(list(exports[0].iterdir()))  # each file once an epoch
    spark_net.close()
    assert list(tmp_path.iterdir()) == exports


def test_direct_approach_with_dataframe(spark, spark_context, digits) -> None:
    train, test = digits
    rows = [(train.features[i].tolist(), int(train.label_indices()[i])) for i in range(train.num_examples)]
    frame = spark.createDataFrame(rows, ["features", "label"]).repartition(3)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=8,
                                              rdd_training_approach="direct", repartition="never")
    net = _network(seed=12)
    spark_net = SparkNetwork(spark_context, net, master)
    for _ in range(5):  # the shuffled DataFrame's order varies per run: a margin over the 90% bar
        spark_net.fit(frame)
    accuracy = spark_net.evaluate(frame.limit(10_000)).accuracy()
    assert accuracy == pytest.approx(net.evaluate(train).accuracy(), abs=1e-12)
    test_accuracy = net.evaluate(test).accuracy()
    print(f"direct DataFrame test accuracy {test_accuracy:.4f}")
    assert test_accuracy >= 0.90, test_accuracy


def test_fit_paths_with_custom_loader(spark_context, digits, npz_batch_paths, npz_loader) -> None:
    _, test = digits
    paths = npz_batch_paths
    net = _network(seed=13)
    master = ParameterAveragingTrainingMaster(averaging_frequency=5, save_updater=False)
    spark_net = SparkNetwork(spark_context, net, master)
    for _ in range(2):
        spark_net.fit_paths(spark_context.parallelize(paths, 2), loader=npz_loader)
    assert net.evaluate(test).accuracy() >= 0.85
    assert not net.updater_state.any()  # save_updater=False: the driver's updater state is not averaged in


def test_bad_options_and_inputs_are_clear_errors(spark_context) -> None:
    with pytest.raises(SparkConfigError, match="rdd_training_approach"):
        ParameterAveragingTrainingMaster(rdd_training_approach="carrier-pigeon")
    with pytest.raises(SparkConfigError, match="averaging_frequency"):
        ParameterAveragingTrainingMaster(averaging_frequency=0)
    spark_net = SparkNetwork(spark_context, _network(), ParameterAveragingTrainingMaster())
    with pytest.raises(SparkInputError, match="empty"):
        spark_net.fit(spark_context.parallelize([], 2))
    with pytest.raises(SparkInputError, match="RDD of DataSets or a DataFrame"):
        spark_net.fit([1, 2, 3])


def test_torch_network_trains_with_parameter_averaging(spark_context, digits) -> None:
    torch = pytest.importorskip("torch")
    from psrv.nn import TorchNetwork

    train, test = digits
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    net = TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,),
                       optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2), seed=5)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=10,
                                              rdd_training_approach="direct")
    spark_net = SparkNetwork(spark_context, net, master)
    for _ in range(2):
        spark_net.fit(_rdd(spark_context, train, 100, 2))
    assert net.evaluate(test).accuracy() >= 0.85
    assert net.updater_state.any()  # Adam's moments averaged back into the driver's network
