"""One real Spark session for the whole test run: a local cluster with two separate executors.

``local-cluster[2,1,1024]`` starts a standalone master and two executor JVMs on this machine, so
tasks really run in other processes (pickling, broadcasts and executor Python workers are
exercised as on a cluster). Executors use the interpreter running the tests, so they import
psrv from the same virtual environment. If the cluster cannot start within the deadline the
tests fail with the reason; there is deliberately no silent fallback to ``local[N]``.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator

import pytest

SPARK_MASTER = os.environ.get("PSRV_TEST_SPARK_MASTER", "local-cluster[2,1,1024]")
if re.fullmatch(r"local\[(\d+|\*)\]", SPARK_MASTER):
    # plain local[N] gives a task one attempt; the retry tests need Spark's usual four
    SPARK_MASTER = SPARK_MASTER[:-1] + ",4]"
EXPECTED_EXECUTORS = 2 if SPARK_MASTER.startswith("local-cluster") else 0
STARTUP_DEADLINE_S = float(os.environ.get("PSRV_TEST_SPARK_STARTUP_S", "120"))


def _spark_home() -> str:
    """pip's pyspark ships the scripts local-cluster launches its executors with."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _configure_environment() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_HOME", _spark_home())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")


def _build_session():
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(SPARK_MASTER)
        .appName("psrv-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.executor.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.task.maxFailures", "4")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.NUMBA_CACHE_DIR", os.environ.get("NUMBA_CACHE_DIR", ""))
        .getOrCreate()
    )


def _registered_executors(sc) -> int:
    """Executors registered with the driver (the driver's own block manager excluded)."""
    return max(0, sc._jsc.sc().getExecutorMemoryStatus().size() - 1)


def _start_session_with_deadline():
    result: dict = {}

    def start() -> None:
        try:
            result["session"] = _build_session()
        except BaseException as exc:  # handed to the test thread below
            result["error"] = exc

    thread = threading.Thread(target=start, name="spark-startup", daemon=True)
    thread.start()
    thread.join(STARTUP_DEADLINE_S)
    if thread.is_alive():
        pytest.fail(
            f"Spark session on {SPARK_MASTER!r} did not start within {STARTUP_DEADLINE_S:.0f} s "
            f"(SPARK_HOME={os.environ.get('SPARK_HOME')}, java on PATH required)",
            pytrace=False,
        )
    if "error" in result:
        pytest.fail(f"Spark session on {SPARK_MASTER!r} failed to start: {result['error']!r}", pytrace=False)
    session = result["session"]
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while _registered_executors(session.sparkContext) < EXPECTED_EXECUTORS:
        if time.monotonic() > deadline:
            seen = _registered_executors(session.sparkContext)
            session.stop()
            pytest.fail(
                f"{SPARK_MASTER!r}: only {seen} of {EXPECTED_EXECUTORS} executors registered within "
                f"{STARTUP_DEADLINE_S:.0f} s",
                pytrace=False,
            )
        time.sleep(0.2)
    return session


@pytest.fixture(scope="session")
def spark() -> Iterator:
    """The session-wide SparkSession (local-cluster with 2 executors of 1 core, 1 GiB)."""
    from psrv.spark.driver.java import java_problem

    problem = java_problem()
    if problem is not None:  # one line, not Spark's gateway trace
        pytest.fail(problem, pytrace=False)
    _configure_environment()
    session = _start_session_with_deadline()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(autouse=True)
def _ship_test_module_by_value(request) -> None:
    """Executors cannot import test modules (nor this conftest) by name, so what they define travels by
    value."""
    from pyspark import cloudpickle

    for module in (getattr(request, "module", None), sys.modules.get(__name__)):
        if module is not None and module.__name__ in sys.modules and not module.__name__.startswith("psrv"):
            cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="session")
def user_script_run(tmp_path_factory) -> dict:
    """What tests/spark/scripts/user_script.py wrote (``failing``, ``user``) and spark-submit's ``output``:
    one application, run as a user runs it, for test_fit_failures.py and test_user_path.py (its own Spark
    application beside the tests' session, started once instead of once per module)."""
    from spark_submit import submit_script

    work = tmp_path_factory.mktemp("user-script")
    results, output = submit_script("user_script.py", work, "spark.task.maxFailures=4")
    return {**results, "output": output}  # spark-submit merges the Python driver's stderr into its stdout


@pytest.fixture(scope="session")
def spark_context(spark):
    """The SparkContext of the session-wide SparkSession."""
    return spark.sparkContext


@pytest.fixture(scope="session")
def digits():
    """scikit-learn's digits as (train, test) DataSets: 64 features scaled to [0, 1], one-hot labels."""
    import numpy as np
    from psrv.nn.data import DataSet
    from sklearn.datasets import load_digits

    data = load_digits()
    features = (data.data / 16.0).astype(np.float32)
    full = DataSet.from_class_indices(features, data.target.astype(np.int64), 10)
    return full.split(0.75, seed=7)



class NpzLoader:
    """A user's own minibatch format (numpy .npz files), read by a loader psrv does not know."""

    def load(self, path: str):
        import numpy as np
        from psrv.nn.data import DataSet

        with np.load(path) as archive:
            return DataSet(archive["x"], archive["y"])


@pytest.fixture
def npz_batch_paths(digits, tmp_path) -> list[str]:
    """The digits training set as .npz files of 16 examples each (for fit_paths with NpzLoader)."""
    import numpy as np

    train, _ = digits
    paths = []
    for i, batch in enumerate(train.batches(16)):
        path = str(tmp_path / f"b{i:04d}.npz")
        np.savez(path, x=batch.features, y=batch.labels)
        paths.append(path)
    return paths


@pytest.fixture
def npz_loader() -> NpzLoader:
    return NpzLoader()
