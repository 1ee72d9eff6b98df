"""What runs in every worker a launcher starts: the user's function, then the leave and the report.

The function, its arguments and its closure travel as PySpark ships functions (cloudpickle): by value
when defined in a script's ``__main__`` or a notebook, else by reference (a local worker imports with the
launcher's ``sys.path``). A local worker is a fresh Python
process (``main``, given the payload's file: no re-import of the launching script); a Spark task
calls ``run_worker`` itself. Either way the worker reports to the launcher's rendezvous: rank 0's return
value with its counts and replica check (``done``), or the exception that stopped it (``failed``).
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import traceback
from typing import Any

from psrv.torch import session
from psrv.torch.environment import WorkerEnvironment
from psrv.torch.rendezvous import ask

log = logging.getLogger(__name__)

#: how long a worker waits for the launcher to take its report
REPORT_TIMEOUT_S = 60.0


def pickler() -> Any:
    """cloudpickle, the copy PySpark vendors (a psrv dependency; ``register_pickle_by_value`` made for
    PySpark counts here too)."""
    from pyspark import cloudpickle

    return cloudpickle


def dump_call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """The function, its arguments and its closure as bytes (by value)."""
    return pickler().dumps((fn, tuple(args), dict(kwargs)))


def run_worker(env: WorkerEnvironment, payload: bytes) -> Any:
    """Run the user's function as worker ``env.rank``, leave, report; re-raises the function's error."""
    os.environ.update(env.variables())
    cloudpickle = pickler()
    try:
        session.abandon()  # a reused Python worker (Spark) forgets any session an earlier task left
        fn, args, kwargs = cloudpickle.loads(payload)
        try:
            value = fn(*args, **kwargs)
        except SystemExit as stop:  # a script's sys.exit(0) is a normal end
            if stop.code not in (0, None):
                raise
            value = None
        report = session.shutdown() or {}
    except BaseException as exc:
        text = traceback.format_exc()
        session.abandon()
        try:
            pickled: bytes | None = cloudpickle.dumps(exc)
        except Exception:
            pickled = None
        try:
            ask(env, ("failed", env.rank, pickled, text), REPORT_TIMEOUT_S)
        except Exception as reporting:
            log.error("rank %d: could not report its failure to the launcher: %s", env.rank, reporting)
        raise
    report["rank"] = env.rank
    report["value"] = cloudpickle.dumps(value) if env.rank == 0 else None
    ask(env, ("done", env.rank, report), REPORT_TIMEOUT_S)
    return value


def run_script(path: str, argv: list[str]) -> None:
    """Run a script as ``__main__`` with ``sys.argv`` = [path, *argv] (what ``psrv run`` ships)."""
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    """A local worker process: the payload file named on the command line, the place from the env."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("PSRV_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(args[0], "rb") as f:
        payload = f.read()
    try:
        run_worker(WorkerEnvironment.from_variables(), payload)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


__all__ = ["REPORT_TIMEOUT_S", "dump_call", "main", "pickler", "run_script", "run_worker"]
