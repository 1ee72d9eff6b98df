"""The PyTorch user's path, run as a user runs it: ``spark-submit --master local-cluster[2,1,1024]`` of a
script with its own ``nn.Module`` classes (tests/spark/scripts/user_script.py), once for every check (and for
test_fit_failures.py: the session fixture ``user_script_run``).

Each test is one of the failures a new user met: (1) a model class of the script reaches the executors,
a helper module beside the script is refused on the driver until shipped; (2) a second network of the same
architecture fits in the same session and Python workers; (3) wrong inputs fail on the driver before
any training job with one clear line, and a worker's psrv error is the first line the user sees.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def user_run(user_script_run) -> dict:
    """The script's results (it runs in its own Spark application, beside the tests' session)."""
    return user_script_run["user"]


def _value(result: dict) -> object:
    assert result["ok"], f"{result.get('type')}: {result.get('error')}\n{result.get('trace')}"
    return result["value"]


@pytest.mark.parametrize("master", ["shared", "averaging"])
def test_script_classes_ship_by_value_and_a_second_network_fits(user_run, master) -> None:
    """Failures 1 and 2: SmallNet lives in the script's __main__; three fits in one session (fresh,
    fresh of the same architecture, the first again) each train their own network."""
    value = _value(user_run[f"refit_{master}"])
    assert value == {"second_changed": True, "distinct": True, "finite": True}


def test_helper_module_beside_the_script_is_refused_until_shipped(user_run) -> None:
    refused = user_run["helper_module_unshipped"]
    assert not refused["ok"] and refused["type"] == "SparkConfigError"
    assert refused["jobs"] == 0  # said on the driver, before any Spark job
    assert "ScaledNet" in refused["error"] and "user_layers" in refused["error"]
    assert "addPyFile" in refused["error"] and "--py-files" in refused["error"]
    assert _value(user_run["helper_module_shipped"]) == "fitted"


@pytest.mark.parametrize(("check", "error_type", "words", "max_jobs"), [
    ("batch_too_large", "SparkConfigError", ["batch_size_per_worker=5000", "at most 120"], 2),
    ("wrong_input_shape", "SparkInputError", ["input_shape is (1, 8, 8)", "(8,)"], 2),
    ("missing_column", "SparkInputError", ["features_col='pixels'"], 0),
    ("locked_loader", "SparkConfigError", ["loader", "cannot be pickled"], 0),
    ("loader_without_load", "SparkConfigError", ["loader", "load(path)"], 0),
])
def test_wrong_input_fails_on_the_driver_with_one_clear_line(user_run, check, error_type, words,
                                                             max_jobs) -> None:
    """Failure 3: no training job starts (at most the light pass that counts the data: the DataFrame's
    conversion and the count)."""
    result = user_run[check]
    assert not result["ok"] and result["type"] == error_type, result
    first_line = result["error"].splitlines()[0]
    for word in words:
        assert word in first_line, first_line
    assert result["jobs"] <= max_jobs


def test_a_workers_psrv_error_is_the_first_line(user_run) -> None:
    result = user_run["worker_error"]
    assert not result["ok"] and result["type"] == "SparkInputError", result
    lines = result["error"].splitlines()
    assert lines[0].startswith("SparkInputError: DataFrame column 'label': row "), lines[0]  # the task's row
    assert "expected integral class indices in [0, 3)" in lines[0], lines[0]
    assert any("at org.apache.spark" in line or "Traceback" in line for line in lines[1:])  # the trace after


def test_own_threshold_algorithm_trains_on_spark_and_resumes_with_its_state(user_run) -> None:
    """HalvingThreshold and Damping live in the script's __main__: the tasks rebuild them (their steps
    were counted on the executors), a checkpoint restores them exactly, and training continues from it."""
    value = _value(user_run["own_strategies"])
    trained = value["trained"]
    assert value["workers"] == 2 and value["finite"]
    assert trained["steps"] > 0 and trained["threshold"] == 0.05 / 2 ** (trained["steps"] // 4)
    assert value["resumed_class"] == "HalvingThreshold" and value["resumed"] == trained
    assert value["post_processor"] == ["Damping", {"keep": 0.995}]
    assert value["continued"]["steps"] > trained["steps"] and value["continued"]["tau"] == 0.05


def test_a_strategy_missing_a_member_is_refused_on_the_driver(user_run) -> None:
    refused = user_run["strategy_without_average"]
    assert not refused["ok"] and refused["type"] == "SparkConfigError", refused
    assert refused["jobs"] == 0
    first_line = refused["error"].splitlines()[0]
    for words in ("threshold_algorithm", "NoAverage", "has no average"):
        assert words in first_line, first_line
