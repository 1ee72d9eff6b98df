"""The encoding strategies' Protocols: psrv's own classes meet them, a user's class is rebuilt from its
shipped class and state (as a task and a resumed checkpoint do), one that does not meet them is refused
on the driver naming what is missing."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.encoding import (
    NoResidualPostProcessor,
    ResidualClipping,
    ResidualEncoder,
    ResidualPostProcessor,
    ThresholdAlgorithm,
)
from psrv.encoding.errors import InvalidStateError
from psrv.encoding.strategies import POST_PROCESSOR_MEMBERS, THRESHOLD_ALGORITHM_MEMBERS, missing_members
from psrv.encoding.thresholds import ALGORITHMS
from psrv.nn import Dense, Network, Output, Sgd
from psrv.spark import strategies
from psrv.spark.driver import checkpoints
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.errors import SparkConfigError, SparkInputError


class EveryOther:
    """A user's threshold algorithm: tau alternates between two values, one per observed step."""

    def __init__(self, low: float = 0.01, high: float = 0.02) -> None:
        self.low, self.high, self.threshold, self.steps = low, high, low, 0

    def observe(self, count: int, n: int) -> None:
        self.steps += 1
        self.threshold = self.high if self.steps % 2 else self.low

    def get_state(self) -> dict:
        return {"low": self.low, "high": self.high, "threshold": self.threshold, "steps": self.steps}

    @classmethod
    def from_state(cls, state: dict) -> EveryOther:
        algorithm = cls(state["low"], state["high"])
        algorithm.threshold, algorithm.steps = state["threshold"], state["steps"]
        return algorithm

    @classmethod
    def average(cls, states: list) -> EveryOther:
        return cls.from_state(max(states, key=lambda s: s["steps"]))


class Halving:
    """A user's post-processor: halves the residual every step."""

    def __init__(self) -> None:
        self.calls = 0

    def process(self, residual, threshold: float) -> None:
        self.calls += 1
        residual *= 0.5

    def get_state(self) -> dict:
        return {"calls": self.calls}

    @classmethod
    def from_state(cls, state: dict) -> Halving:
        processor = cls()
        processor.calls = state["calls"]
        return processor


def test_psrv_strategies_meet_their_protocols_and_round_trip() -> None:
    for cls in ALGORITHMS.values():
        algorithm = cls()
        assert isinstance(algorithm, ThresholdAlgorithm)
        assert missing_members(algorithm, THRESHOLD_ALGORITHM_MEMBERS) == []
        algorithm.observe(0, 100)
        assert cls.from_state(algorithm.get_state()) == algorithm
        assert cls.average([algorithm.get_state()]).threshold == algorithm.threshold
    clipping = ResidualClipping(3.0, 2)
    clipping.process(np.ones(4, np.float32), 0.1)
    for processor in (clipping, NoResidualPostProcessor()):
        assert isinstance(processor, ResidualPostProcessor)
        assert missing_members(processor, POST_PROCESSOR_MEMBERS) == []
        again = type(processor).from_state(processor.get_state())
        assert again.get_state() == processor.get_state()
    with pytest.raises(InvalidStateError, match="not ResidualClipping"):
        ResidualClipping.from_state(NoResidualPostProcessor().get_state())


def test_a_users_classes_are_rebuilt_from_their_shipped_classes_and_states() -> None:
    algorithm, processor = EveryOther(), Halving()
    encoder = ResidualEncoder(64, threshold_algorithm=algorithm, post_processor=processor)
    for _ in range(3):
        encoder.encode_update(np.full(64, 0.004, np.float32))
    blob = strategies.classes_to_bytes([algorithm, processor])
    rebuilt = strategies.rebuild(blob, [algorithm.get_state(), processor.get_state()],
                                 [strategies.THRESHOLD, strategies.POST_PROCESSOR])
    assert [type(s) for s in rebuilt] == [EveryOther, Halving]
    assert [s.get_state() for s in rebuilt] == [{"low": 0.01, "high": 0.02, "threshold": 0.02, "steps": 3},
                                                {"calls": 3}]
    with pytest.raises(InvalidStateError, match="EveryOther.from_state"):
        strategies.rebuild(blob, [{"low": 1}, {"calls": 0}],
                           [strategies.THRESHOLD, strategies.POST_PROCESSOR])
    with pytest.raises(InvalidStateError, match="unknown threshold algorithm"):  # no classes: psrv's only
        strategies.rebuild(None, [algorithm.get_state()], [strategies.THRESHOLD])


class _Master:
    def __init__(self, threshold_algorithm, residual_post_processor) -> None:
        self.threshold_algorithm = threshold_algorithm
        self.residual_post_processor = residual_post_processor


def test_a_checkpoint_keeps_a_users_strategies_and_their_state(tmp_path) -> None:
    network = Network([Dense(4), Output(2)], input_shape=(3,), updater=Sgd(0.1), seed=1)
    algorithm = EveryOther(0.5, 0.25)
    algorithm.observe(1, 10)
    processor = Halving()
    processor.calls = 7
    checkpoints.save(None, str(tmp_path), network, _Master(algorithm, processor), 1, [(1, {"loss": 0.5})])
    resumed = _Master(EveryOther(), ResidualClipping())  # a fresh run: the checkpoint's replace these
    found = checkpoints.load_newest(None, str(tmp_path), network, resumed)
    assert found is not None and found.epoch == 1
    assert type(resumed.threshold_algorithm) is EveryOther
    assert resumed.threshold_algorithm.get_state() == algorithm.get_state()
    assert type(resumed.residual_post_processor) is Halving
    assert resumed.residual_post_processor.get_state() == {"calls": 7}


def test_a_checkpoint_without_classes_restores_psrv_algorithms(tmp_path) -> None:
    """A checkpoint written before strategies travelled with their classes holds only the state."""
    import msgpack
    from psrv.encoding import AdaptiveThreshold

    network = Network([Dense(4), Output(2)], input_shape=(3,), updater=Sgd(0.1), seed=1)
    path = checkpoints.save(None, str(tmp_path), network, _Master(AdaptiveThreshold(0.125), None), 3, [])
    with open(path, "rb") as fh:
        record = msgpack.unpackb(fh.read(), raw=False)
    assert "strategy_classes" not in record  # no post-processor given: only the threshold state
    master = _Master(AdaptiveThreshold(1.0), ResidualClipping())
    checkpoints.load_newest(None, str(tmp_path), network, master)
    assert master.threshold_algorithm == AdaptiveThreshold(0.125)
    record["threshold_state"] = {"type": "Unknown"}
    with open(path, "wb") as fh:
        fh.write(msgpack.packb(record, use_bin_type=True))
    with pytest.raises(SparkInputError, match="cannot be restored"):
        checkpoints.load_newest(None, str(tmp_path), network, master)


class NoObserve:
    threshold = 0.1

    def get_state(self) -> dict:
        return {}


class StateNotPlain(EveryOther):
    def get_state(self) -> dict:
        return {"when": object()}


def test_a_strategy_that_does_not_meet_the_protocol_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(SparkConfigError, match=r"threshold_algorithm: a NoObserve is not a psrv.encoding."
                                               r"ThresholdAlgorithm: it has no observe, from_state, average"):
        SharedTrainingMaster(threshold_algorithm=NoObserve())
    with pytest.raises(SparkConfigError, match="residual_post_processor: .* it has no from_state"):
        SharedTrainingMaster(residual_post_processor=type("Clip", (), {"process": lambda *a: None,
                                                                       "get_state": lambda self: {}})())
    with pytest.raises(SparkConfigError, match="get_state.*msgpack"):
        SharedTrainingMaster(threshold_algorithm=StateNotPlain())
    master = SharedTrainingMaster(threshold_algorithm=EveryOther(), residual_post_processor=Halving())
    assert type(master.threshold_algorithm) is EveryOther
