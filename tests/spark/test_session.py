"""The shared Spark fixture really gives separate executors that import psrv from this venv."""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def _where(_: int) -> tuple[str, str]:
    import psrv.spark

    return sys.executable, os.path.dirname(psrv.spark.__file__)


def test_executors_run_tasks_with_this_interpreter(spark_context) -> None:
    seen = set(spark_context.parallelize(range(4), 4).map(_where).collect())
    import psrv.spark

    assert seen == {(sys.executable, os.path.dirname(psrv.spark.__file__))}


def test_two_executors_registered(spark_context) -> None:
    if not spark_context.master.startswith("local-cluster"):
        pytest.skip(f"master {spark_context.master} has no separate executors")
    assert spark_context._jsc.sc().getExecutorMemoryStatus().size() - 1 == 2
