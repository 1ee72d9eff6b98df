"""Watching a real fit on Spark: metrics sinks, worker logs on the driver, live progress on stderr."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output, Sgd
from psrv.nn.data import DataSet
from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork
from psrv.spark.config import VoidConfiguration
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.observe.worker_logs import DRIVER_LOGGER

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, dict[str, float]]] = []

    def on_metrics(self, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.calls.append((step, epoch, dict(metrics)))


def _master(**kwargs) -> SharedTrainingMaster:
    conf = VoidConfiguration(unicast_port=0, mesh_build_mode="plain", heartbeat_ms=300,
                             join_timeout_ms=120_000)  # a loaded machine starts executors slowly
    return SharedTrainingMaster(conf, batch_size_per_worker=16, threshold_algorithm=AdaptiveThreshold(3e-2),
                                rdd_training_approach="direct", num_workers=2, **kwargs)


def test_fit_feeds_sinks_relays_debug_logs_and_shows_progress(spark_context, digits, tmp_path: Path,
                                                              caplog, capsys) -> None:
    pytest.importorskip("tensorboard")
    from psrv.spark.observe.metrics import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, _ = digits
    recorder = Recorder()
    master = _master(encoding_debug_mode=True, loggers=[recorder], progress=True)
    network = Network([Dense(32, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2),
                      seed=5)
    spark_net = SparkNetwork(spark_context, network, master)
    rdd = spark_context.parallelize(list(train.batches(50)), 2)
    board = TensorBoardLogger(str(tmp_path / "tb"))
    caplog.set_level(logging.INFO, logger=DRIVER_LOGGER)
    spark_net.fit(rdd, loggers=[board])
    board.close()
    fit = master.last_fit

    # worker logs: the encoding_debug_mode statistics reached the driver's log, naming worker and partition
    relayed = [r.getMessage() for r in caplog.records if r.name == DRIVER_LOGGER]
    debug = [m for m in relayed if "encoding step" in m]
    assert debug, [r.getMessage() for r in caplog.records]
    assert {0, 1} <= {int(m.split("partition ")[1].split()[0]) for m in debug}
    assert all("tau=" in m and "sparsity=" in m for m in debug)
    # rate-limited: far fewer lines than steps
    assert len(debug) < fit["steps"]

    # sinks: the master's metrics at the fit's last step, per-worker steps before it
    assert master.loggers == [recorder]  # fit(loggers=...) added the board for that fit only
    steps = [c[0] for c in recorder.calls]
    assert steps == sorted(set(steps)) and steps[-1] == network.iteration
    final = recorder.calls[-1][2]
    assert final["master/loss"] == pytest.approx(fit["score"])
    assert final["master/updates_applied"] == fit["controller_updates_applied"]
    assert final["master/bytes_received"] > 0 and final["master/bytes_sent"] > 0
    assert 0 < final["master/sparsity"] <= 1
    names = {k for c in recorder.calls for k in c[2]}
    assert {"worker/p0/loss", "worker/p1/loss", "worker/p0/updates_applied"} <= names
    sparsities = [v for c in recorder.calls for k, v in c[2].items() if k.endswith("/sparsity")]
    assert sparsities and all(0 <= v <= 1 for v in sparsities)
    assert master.training_stats == []  # sinks do not turn on the stats collection

    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"master/loss", "master/updates_applied", "worker/p0/loss", "worker/p1/sparsity"} <= tags
    assert accumulator.Scalars("master/loss")[-1].step == network.iteration

    # live progress: at least the closing line on stderr (stderr is no terminal under pytest)
    err = capsys.readouterr().err
    assert "psrv fit" in err and "2 workers" in err and "master applied" in err, err
    assert f"{fit['steps']:,} steps" in err, err  # the closing line counts the job's own steps


class WarningLoader:
    """A user's loader that warns about every file (as user code on an executor might)."""

    def load(self, path: str):
        import logging

        import numpy as np
        from psrv.nn.data import DataSet

        logging.getLogger("user.loader").warning("odd file %s", path.rsplit("/", 1)[-1])
        with np.load(path) as archive:
            return DataSet(archive["x"], archive["y"])


def test_parameter_averaging_feeds_sinks_and_relays_worker_warnings(spark_context, tmp_path: Path,
                                                                    caplog) -> None:
    rng = np.random.default_rng(0)
    features = rng.standard_normal((96, 4)).astype(np.float32)
    data = DataSet.from_class_indices(features, rng.integers(0, 2, 96), 2)
    paths = []
    for i, batch in enumerate(data.batches(16)):
        paths.append(str(tmp_path / f"b{i}.npz"))
        np.savez(paths[-1], x=batch.features, y=batch.labels)
    recorder = Recorder()
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2,
                                              loggers=recorder)
    net = Network([Dense(8, activation="relu"), Output(2)], input_shape=(4,), updater=Sgd(0.1), seed=1)
    caplog.set_level(logging.WARNING, logger=DRIVER_LOGGER)
    spark_net = SparkNetwork(spark_context, net, master)
    spark_net.fit_paths(spark_context.parallelize(paths, 2), loader=WarningLoader())
    relayed = [r for r in caplog.records if r.name == DRIVER_LOGGER and "odd file" in r.getMessage()]
    assert relayed and all(r.levelno == logging.WARNING for r in relayed)
    assert all("(user.loader): odd file b" in r.getMessage() and " partition " in r.getMessage()
               for r in relayed)
    assert len(relayed) <= len(paths)  # one warning per load at most; repeats within a second are counted
    finals = [c for c in recorder.calls if "master/loss" in c[2]]
    assert finals and finals[-1][0] == net.iteration
    assert finals[-1][2]["master/loss"] == pytest.approx(master.last_score)
    assert any(k.startswith("worker/p") for c in recorder.calls for k in c[2])
