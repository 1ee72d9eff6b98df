"""Fits that go wrong, run as a user runs them: ``spark-submit --master local-cluster[2,1,1024]`` of a
script (tests/spark/scripts/user_script.py, whose failing fits run first in the application it shares
with test_user_path.py: the session fixture ``user_script_run``). An exception of the user's forward
fails the job at its first attempt, with gradient sharing and with parameter averaging (Spark's four
attempts per task only raised it again, each after a task start-up); NaN is named by its row before
training, and during it; a wrong ``input_shape`` is named; the progress lines count each epoch's own
steps and examples, 1-based, and a failed fit ends with ``failed:``."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def failing(user_script_run) -> dict:
    """What each failing fit raised, and the application's output (its progress lines)."""
    return {**user_script_run["failing"], "output": user_script_run["output"]}


def _section(output: str, name: str) -> str:
    """What the script wrote (progress lines included) while running check ``name``."""
    before, found, _ = output.partition(f"--- {name} finished ---")
    assert found, f"no end marker of {name!r} in the script's output:\n{output[-3000:]}"
    return before.rsplit(" finished ---", 1)[-1]


def _attempts(result: dict) -> list[tuple[int, int, float]]:
    """(partition, attempt, when it raised) of each task attempt that reached the user's forward."""
    return [(int(p), int(a), float(t)) for p, a, t in (line.split() for line in result["attempts"])]


def _fails_soon_after_the_raise(result: dict, failing: dict, raised: float | None = None) -> None:
    """From the first raise (or ``raised``) to the fit's failure on the driver: the task's report and
    the job's cancel, no retry and no wait for a timeout; well under the good 2-epoch fit of the same
    data in the same run (a bound in seconds would measure the machine's load, not psrv, and the whole
    failed fit's time is mostly the task start-up a good fit pays too)."""
    if raised is None:
        raised = min(t for _, _, t in _attempts(result))
    assert 0 <= result["ended_at"] - raised < failing["progress"]["seconds"], (result, failing["progress"])


def test_an_exception_of_the_users_forward_fails_the_job_at_its_first_attempt(failing) -> None:
    result = failing["user_code"]
    assert not result["ok"] and result["type"] == "UserCodeError", result
    assert result["error"].startswith("ValueError: boom from the user's forward"), result["error"]
    attempts = _attempts(result)
    assert attempts and {a for _, a, _ in attempts} == {0}, attempts  # no task was tried again
    _fails_soon_after_the_raise(result, failing)
    shown = _section(failing["output"], "user_code")
    assert re.search(r"psrv fit \(epoch 1\) failed: UserCodeError: ValueError: boom", shown), shown[-3000:]
    assert "psrv fit (epoch 1) done" not in shown


def test_parameter_averaging_fails_a_users_exception_at_its_first_attempt_too(failing) -> None:
    result = failing["user_code_averaging"]
    assert not result["ok"] and result["type"] == "UserCodeError", result
    assert result["error"].startswith("ValueError: boom from the user's forward"), result["error"]
    attempts = _attempts(result)
    assert attempts and {a for _, a, _ in attempts} == {0}, attempts  # Spark ran no task again
    _fails_soon_after_the_raise(result, failing)


def test_progress_lines_count_each_epochs_own_steps_and_examples(failing) -> None:
    result = failing["progress"]
    assert result["ok"], result
    steps = result["value"]["steps"]
    # 2 workers x 120 rows in minibatches of 16: 8 steps each, every epoch; 240 examples
    assert steps == [16, 16]
    shown = _section(failing["output"], "progress")
    closing = re.findall(r"psrv fit \(epoch (\d+)\) done: (.*)", shown)
    assert [int(epoch) for epoch, _ in closing] == [1, 2], shown[-3000:]
    for epoch, line in closing:
        assert line.startswith(f"2 workers | epoch {epoch} | 16 steps, 240 examples |"), line
    # mid-epoch lines count this epoch's 2 workers only (a worker already done is "seen", not online)
    assert all(int(seen) <= 2 for seen in re.findall(r"\((\d+) seen\)", shown)), shown[-3000:]


def test_nan_is_named_by_its_row_before_training_and_during_it(failing) -> None:
    before = failing["nan_before"]
    assert before["type"] == "SparkInputError", before
    assert "in the features of row 24 of partition 1 (index [5] within the row)" in before["error"], before
    during = failing["nan_during"]
    assert during["type"] == "SparkInputError", during
    said = r"non-finite value nan in the features of row \d+ of partition (\d+)"
    found = re.search(said, during["error"])
    assert found, during
    # at the first attempt, as above: every training forward (noted by the module) was of attempt 0,
    # and the failure came soon after the last forward of the partition that holds the NaN
    attempts = _attempts(during)
    assert attempts and {a for _, a, _ in attempts} == {0}, attempts
    partition = int(found.group(1))
    _fails_soon_after_the_raise(during, failing, max(t for p, _, t in attempts if p == partition))


def test_a_wrong_input_shape_is_named_with_the_samples_shape(failing) -> None:
    shape = failing["shape"]
    assert shape["type"] == "SparkInputError", shape
    assert "(8,) per example" in shape["error"] and "input_shape is (4,)" in shape["error"], shape["error"]
