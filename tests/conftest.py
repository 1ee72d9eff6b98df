"""Fixtures shared by every test folder."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import tempfile

import pytest

from tests.bytecode import compile_project_modules

# Compiled numba kernels are cached per test run in a writable place, as on a Spark executor.
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "psrv-numba-cache"))
# Every JVM the suite starts (Spark drivers, executors, standalone daemons, spark-submit) lives seconds
# to minutes and runs little code hot: C2 compilation and the parallel collector's threads cost more CPU
# than they win back. C1 only and the serial collector took a session with four small fits from 133-157
# s of CPU to 92-100 s on 2 cores (wall 74-90 s to 56-60 s). Inherited by every process the tests start;
# a JAVA_TOOL_OPTIONS of your own is kept as it is. (Each JVM says "Picked up JAVA_TOOL_OPTIONS" on
# stderr.)
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


# --- parallel runs ---------------------------------------------------------------------------------------
# README's test command runs the suite on every core (pytest-xdist, `-n auto --dist loadfile` in
# pyproject.toml). A test file is one unit of work, so a module's fixtures run once. Two more units span
# files: every test of the run's one Spark session (tests/spark/conftest.py's `spark`), and the tests
# reading the one user-script application (`user_script_run`); each still starts once per run, in the
# one worker process that runs its unit. The longest units start first, so no worker is left with one
# of them at the end.
SPARK_SESSION_UNIT = "spark-session"
USER_SCRIPT_UNIT = "user-script-application"
USER_SCRIPT_FILES = frozenset({"tests/spark/test_fit_failures.py", "tests/spark/test_user_path.py"})
# files under tests/spark that never use the shared session (their own application, or no Spark at all)
OWN_SPARK_FILES = frozenset({
    "tests/spark/test_demo.py", "tests/spark/test_environment_check.py", "tests/spark/test_examples.py",
    "tests/spark/test_multihost_export.py", "tests/spark/test_packaged.py",
    "tests/spark/test_prefetch_batching.py", "tests/spark/test_spark_data_local.py",
})
LONGEST_FIRST = (SPARK_SESSION_UNIT, "tests/cluster/test_netns_cluster.py", "tests/spark/test_packaged.py",
                 USER_SCRIPT_UNIT, "tests/sim/test_real.py", "tests/spark/test_examples.py",
                 "tests/spark/test_multihost_export.py", "tests/spark/test_environment_check.py",
                 "tests/spark/test_demo.py")


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to in a parallel run (see above)."""
    path = nodeid.split("::", 1)[0]
    if path in USER_SCRIPT_FILES:
        return USER_SCRIPT_UNIT
    if path.startswith("tests/spark/") and path not in OWN_SPARK_FILES:
        return SPARK_SESSION_UNIT
    return path


# A worker ended by a signal dies without a Python traceback, and xdist only says "node down: Not
# properly terminated". Each worker prints every thread's stack on the real stderr when SIGTERM or
# SIGHUP arrives (then dies as before), so the run's log names the test and the line it was at; a
# segfault or abort already prints one (pytest's faulthandler), and only SIGKILL stays silent.
WORKER_STACK_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_worker_stderr: list = []  # kept open for the run: faulthandler writes to its file descriptor


def pytest_configure(config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # once per run, before any worker starts
        compile_project_modules()  # see tests/bytecode.py
    elif not _worker_stderr:
        # capturing is suspended here, so this is the worker's real stderr, not a test's capture
        stderr = os.fdopen(os.dup(sys.stderr.fileno()), "w")
        _worker_stderr.append(stderr)
        for signum in WORKER_STACK_SIGNALS:
            faulthandler.register(signum, file=stderr, all_threads=True, chain=True)


def pytest_collection_modifyitems(config, items) -> None:
    """A test that uses the shared Spark session or the user-script application outside its unit would
    start a second one in another worker: refused at collection, naming the fix."""
    wrong = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        unit = work_unit(item.nodeid)
        if fixtures & {"spark", "spark_context"} and unit != SPARK_SESSION_UNIT:
            wrong.append(f"{item.nodeid} uses the shared Spark session but belongs to {unit!r}")
        if "user_script_run" in fixtures and unit != USER_SCRIPT_UNIT:
            wrong.append(f"{item.nodeid} reads the user-script application but belongs to {unit!r}")
    if wrong:
        raise pytest.UsageError("tests/conftest.py's work units: " + "; ".join(wrong)
                                + " (fix: OWN_SPARK_FILES or USER_SCRIPT_FILES there)")


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist not installed: nothing to schedule
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:
    class _WorkUnitScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with ``work_unit`` as the scope, the longest units queued first."""

        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:
                self._ordered = True
                rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
                units = sorted(self.workqueue.items(), key=lambda kv: rank.get(kv[0], len(rank)))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") == "loadfile":
            return _WorkUnitScheduling(config, log)
        return None
