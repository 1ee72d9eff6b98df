"""A task's fatal failures (the row they happened at, the user's code) and the driver's environment check,
without Spark: the pure parts of psrv.spark.task.failures and psrv.spark.driver.preflight."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from psrv.nn.errors import NonFiniteLossError
from psrv.spark.driver import preflight
from psrv.spark.driver.job_errors import fatal_error
from psrv.spark.errors import SparkInputError, UserCodeError
from psrv.spark.task import failures
from psrv.spark.task.environment import describe_python, environment_probe
from psrv.transport.counters import Counters


def test_a_non_finite_value_is_named_by_its_row_in_the_partition() -> None:
    features = np.zeros((4, 3), np.float32)
    features[2, 1] = np.nan
    assert failures.first_non_finite(features) == (2, (1,), pytest.approx(np.nan, nan_ok=True))
    assert failures.first_non_finite([np.ones((2, 2)), np.array([[0.0], [np.inf]])])[0] == 1
    assert failures.first_non_finite(np.arange(4)) is None  # integers hold no NaN
    batch = SimpleNamespace(features=features, labels=np.zeros((4, 2)))
    with pytest.raises(SparkInputError, match=r"nan in the features of row 102 of partition 3 .*index \[1\]"):
        failures.check_finite(batch, partition=3, first_row=100)


def test_a_step_error_is_the_users_own_exception_first() -> None:
    raised = failures.step_error(ValueError("boom from forward\nsecond line"), 1, 64, 32)
    assert isinstance(raised, UserCodeError)
    assert str(raised).startswith("ValueError: boom from forward (raised by the network's own code")
    assert "rows 64..95 of partition 1" in str(raised)
    nan = failures.step_error(NonFiniteLossError("loss is nan at iteration 3"), 0, 0, 16)
    assert isinstance(nan, SparkInputError) and "rows 0..15 of partition 0" in str(nan)
    own = SparkInputError("psrv's own")
    assert failures.step_error(own, 0, 0, 1) is own


def test_a_fatal_report_travels_in_the_heartbeat_gauges_and_comes_back_as_its_class(monkeypatch) -> None:
    # the task then waits for the driver's cancellation: several beats, never under 3 s (not here)
    assert failures.fatal_wait_s(0.5) == 3.0 and failures.fatal_wait_s(1.0) == 6.0
    monkeypatch.setattr(failures, "FATAL_WAIT_MIN_S", 0.0)
    node = SimpleNamespace(counters_=Counters())
    failures.report_fatal(node, "job1", UserCodeError("ValueError: boom"), heartbeat_s=0.0)
    transient = SimpleNamespace(counters_=Counters())
    failures.report_fatal(transient, "job1", TimeoutError("slow"), 0.0)  # a retry may cure it: not reported
    assert failures.FATAL_GAUGE not in transient.counters_.snapshot()
    stats = node.counters_.snapshot()
    other = {"stats": {failures.JOB_GAUGE: "job0", failures.FATAL_GAUGE: "UserCodeError: old"}}
    assert failures.fatal_report([other, {"stats": {}}], "job1") is None
    report = failures.fatal_report([other, {"state": "left", "stats": stats}], "job1")
    assert report == "UserCodeError: ValueError: boom"
    error = fatal_error(report, "cancelled the job")
    assert isinstance(error, UserCodeError) and str(error).startswith("ValueError: boom\n")
    assert "cancelled the job at this first failure" in str(error)


def test_the_environment_check_names_what_differs() -> None:
    driver = describe_python(("psrv",))
    assert driver["psrv"] is not None and driver["executable"]
    assert preflight.environment_differences(driver, dict(driver)) == []
    missing = {"executable": "/usr/bin/python3", "python": "3.9.2", "psrv": None,
               "psrv_error": "ModuleNotFoundError: No module named 'psrv'"}
    said = preflight.environment_differences({**driver, "torch": "2.1.0"}, missing)
    assert said[0] == "psrv cannot be imported there (ModuleNotFoundError: No module named 'psrv')"
    assert f"Python 3.9.2 there, {driver['python']} on the driver" in said
    assert "torch none (None) there, 2.1.0 on the driver" in said
    assert next(environment_probe(("no_such_module_here",))(iter(())))["no_such_module_here"] is None


def test_the_profile_finds_the_first_non_finite_row_of_a_partition() -> None:
    from psrv.nn.data import DataSet
    from psrv.spark.task.profile import profile_partition

    first = DataSet(np.zeros((5, 2), np.float32), np.eye(2, dtype=np.float32)[[0, 1, 0, 1, 0]])
    features = np.zeros((5, 2), np.float32)
    features[3, 0] = np.inf
    second = DataSet(features, first.labels)
    sizes, sample, bad = next(profile_partition(iter([first, second])))
    assert sizes == [5, 5] and sample.num_examples == 2 and bad == (8, "features", [0], np.inf)
    data = preflight.DataProfile([sizes, [5]], sample, [None, bad])
    with pytest.raises(SparkInputError, match=r"inf\) in the features of row 8 of partition 1"):
        preflight.check_finite_data(data)


class _RaisingAfter:
    """Torch-free stand-in for a user's network whose own code raises at its second minibatch."""

    def __init__(self) -> None:
        self.calls = 0

    def compute_update(self, features, labels, mask):
        self.calls += 1
        if self.calls == 2:
            raise ValueError("boom from the user's forward")
        return np.zeros(3), 0.5


def test_an_averaging_round_returns_the_users_error_instead_of_raising_it(monkeypatch) -> None:
    """Raised, Spark would run the task again (and again) to meet the same exception; returned in the
    round's result, the driver raises it as UserCodeError at the first attempt."""
    from psrv.nn.data import DataSet
    from psrv.spark.task import averaging
    from psrv.spark.task.results import RoundResult, add_results

    network = _RaisingAfter()
    network.params = network.updater_state = np.zeros(3)
    network.iteration = 0
    network.apply_update = lambda update: None
    monkeypatch.setattr(averaging, "training_network", lambda payload: network)
    monkeypatch.setattr(averaging, "buffers_of", lambda network: None)
    payload = SimpleNamespace(value=SimpleNamespace(epoch=0, updater_state=None))
    trainer = averaging.RoundTrainer(payload, None, prefetch=0, collect_stats=True, round_number=0)
    batches = [DataSet(np.ones((4, 3), np.float32), np.eye(2, dtype=np.float32)[[0, 1, 0, 1]])] * 3
    (result,) = list(trainer(iter(batches)))
    assert result.steps == 1 and network.calls == 2  # stopped at the failing minibatch
    assert result.error.startswith("UserCodeError: ValueError: boom from the user's forward")
    assert "rows 4..7 of partition -1" in result.error  # the failing minibatch's rows
    assert {e["epoch"] for e in result.events} == {1}  # epochs count from 1 in the stats
    healthy = RoundResult(np.zeros(3), None, 2, 1.0, 8, [])
    assert add_results(healthy, result).error == result.error  # one failing task fails the round
    error = fatal_error(result.error, "ended the job")
    assert isinstance(error, UserCodeError) and str(error).startswith("ValueError: boom from the user's")
