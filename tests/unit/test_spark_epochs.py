"""EarlyStopping and checkpoint files, without Spark."""

from __future__ import annotations

import os

import numpy as np
import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark.driver import checkpoints
from psrv.spark.driver.epochs import EarlyStopping
from psrv.spark.errors import SparkConfigError


def test_early_stopping_waits_patience_epochs_without_improvement() -> None:
    stopper = EarlyStopping("val_loss", patience=2)
    assert [stopper.on_epoch_end(e, {"val_loss": v}) for e, v in enumerate([1.0, 0.8, 0.9, 0.85, 0.7], 1)] \
        == [False, False, False, True, False]
    assert stopper.stopped_epoch == 4 and stopper.best_epoch == 5  # (called once more after the stop)
    accuracy = EarlyStopping("val_accuracy", patience=0)  # auto: accuracy is maximised
    assert not accuracy.on_epoch_end(1, {"val_accuracy": 0.5})
    assert not accuracy.on_epoch_end(2, {"val_accuracy": 0.6})
    assert accuracy.on_epoch_end(3, {"val_accuracy": 0.6})
    with pytest.raises(SparkConfigError, match="no metric 'val_f1'.*validation_data"):
        EarlyStopping("val_f1").on_epoch_end(1, {"loss": 1.0})
    with pytest.raises(SparkConfigError, match="mode"):
        EarlyStopping("loss", mode="up")


class _Master:
    threshold_algorithm = AdaptiveThreshold(0.25)


def test_checkpoint_round_trips_network_updater_threshold_and_history(tmp_path) -> None:
    net = Network([Dense(8), Output(3)], input_shape=(4,), updater=Adam(1e-2), seed=1)
    rng = np.random.default_rng(0)
    net.fit((rng.normal(size=(16, 4)).astype(np.float32), rng.integers(0, 3, 16)), epochs=2, batch_size=8)
    history = [(1, {"loss": 1.5}), (2, {"loss": 1.2, "val_accuracy": 0.5})]
    path = checkpoints.save(None, str(tmp_path / "ck"), net, _Master(), 2, history)
    checkpoints.save(None, str(tmp_path / "ck"), net, _Master(), 1, history[:1])
    assert checkpoints.newest(None, str(tmp_path / "ck")) == path
    assert [n for n in os.listdir(tmp_path / "ck") if n.startswith(".")] == []  # no temporary left
    target = Network([Dense(8), Output(3)], input_shape=(4,), updater=Adam(1e-2), seed=9)
    master = type("M", (), {"threshold_algorithm": AdaptiveThreshold(1e-3)})()
    found = checkpoints.load_newest(None, str(tmp_path / "ck"), target, master)
    assert found.epoch == 2 and found.history == history and not found.stopped
    np.testing.assert_array_equal(target.params, net.params)
    np.testing.assert_array_equal(target.updater_state, net.updater_state)
    assert (target.iteration, target.epoch) == (net.iteration, net.epoch)
    assert master.threshold_algorithm.threshold == pytest.approx(0.25)
    assert checkpoints.load_newest(None, str(tmp_path / "none"), target, master) is None
