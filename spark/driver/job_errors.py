"""A worker's error as the user's first line: the Python exception that ended a task, then Spark's trace.

Spark reports a failed task as a Java exception whose text holds the Python worker's traceback
somewhere after dozens of lines of JVM frames. :func:`worker_errors` finds the exception line of that
traceback (``module.Type: message``) and raises it again on the driver as the first line of the error,
as the same psrv error class where it is one (so ``except SparkInputError`` works across the job), with
the whole Spark trace after it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from psrv.spark.errors import SparkError, SparkInputError, TrainingJobError, UserCodeError

_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)): (.*)$")
_TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class WorkerError:
    """The exception that ended a Python task: ``psrv.spark.errors.SparkInputError`` and its message."""

    type_name: str
    message: str

    @property
    def short_type(self) -> str:
        return self.type_name.rsplit(".", 1)[-1]

    def first_line(self) -> str:
        return f"{self.short_type}: {self.message}"


def _texts(error: BaseException) -> Iterator[str]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield str(current)
        java = getattr(current, "java_exception", None)
        if java is not None:
            with suppress(Exception):  # a dead JVM gateway: the Python text is enough
                yield str(java.toString())
        current = current.__cause__ or current.__context__


def find_worker_error(error: BaseException) -> WorkerError | None:
    """The last exception line of the last Python traceback in ``error``'s text (or its causes)."""
    for text in _texts(error):
        start = text.rfind(_TRACEBACK)
        if start < 0:
            continue
        found: WorkerError | None = None
        for line in text[start:].splitlines()[1:]:
            stripped = line.rstrip()
            if stripped.startswith(("\tat ", "\t... ")):
                break  # the JVM frames after the Python traceback
            match = _EXCEPTION_LINE.match(stripped)
            if match and not line.startswith((" ", "\t")):
                found = WorkerError(match.group(1), match.group(2).strip())
        if found is not None:
            return found
    return None


def _psrv_class(type_name: str) -> type[SparkError] | None:
    """The psrv error class a worker raised, where it is one that takes a message."""
    module, _, name = type_name.rpartition(".")
    if not module.startswith("psrv."):
        return None
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


def as_user_error(error: BaseException, what: str) -> BaseException:
    """``error`` with the worker's exception as its first line (``error`` itself when none is found)."""
    found = find_worker_error(error)
    if found is None:
        return error
    text = f"{found.first_line()}\n  ({what}: raised on a Spark worker; Spark's trace follows)\n{error}"
    cls = _psrv_class(found.type_name)
    if cls is not None:
        try:
            return cls(text)
        except Exception:  # noqa: BLE001 - a class that wants other arguments
            pass
    return TrainingJobError(text)


@contextmanager
def worker_errors(what: str) -> Iterator[None]:
    """Re-raise a failed Spark job's error with the worker's own exception as the first line."""
    try:
        yield
    except TrainingJobError as exc:  # a master's summary of a failed job: the worker's line goes first
        if exc.__cause__ is None or find_worker_error(exc.__cause__) is None:
            raise
        raise as_user_error(exc.__cause__, what) from exc.__cause__
    except SparkError:  # the driver's own psrv errors already say what happened
        raise
    except Exception as exc:
        converted = as_user_error(exc, what)
        if converted is exc:
            raise
        raise converted from exc


def fatal_error(report: str, how: str) -> SparkError:
    """The fatal error a task reported (``"UserCodeError: ValueError: boom ..."``) as its own class, the
    user's exception first; ``how`` says what psrv did at this first failure (``"cancelled the job"``)."""
    name, _, message = report.partition(": ")
    cls = {"UserCodeError": UserCodeError, "SparkInputError": SparkInputError}.get(name)
    text = (f"{message}\n  (a task failed with it; psrv {how} at this first failure instead of letting Spark "
            "retry: a retry would fail the same way)")
    return cls(text) if cls is not None else TrainingJobError(f"{report}{text[len(message):]}")


__all__ = ["WorkerError", "as_user_error", "fatal_error", "find_worker_error", "worker_errors"]
