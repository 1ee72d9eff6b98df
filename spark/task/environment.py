"""What an executor's Python is: the task side of the driver's environment check.

The probe must run where psrv itself may be missing (an executor started with another interpreter),
so it imports nothing of psrv and is built inside a function: Spark's cloudpickle then ships it by
value, with no reference to this module for the executor to import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["describe_python", "environment_probe"]


Probe = Callable[[Iterator[Any]], Iterator[dict[str, Any]]]


def environment_probe(modules: tuple[str, ...] = ("psrv",)) -> Probe:
    """The function the check's one-task job maps over its partition (shipped by value): this
    interpreter's path, Python version, and the version of each of ``modules`` it imports (None, and
    ``<name>_error`` saying why, when it cannot)."""

    def probe(_: Iterator[Any]) -> Iterator[dict[str, Any]]:
        import importlib
        import platform
        import sys

        found: dict[str, Any] = {"executable": sys.executable, "python": platform.python_version()}
        for name in modules:
            try:
                found[name] = str(getattr(importlib.import_module(name), "__version__", "unknown"))
            except Exception as exc:  # noqa: BLE001 - any import failure is what the driver reports
                found[name] = None
                found[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        yield found

    return probe


def describe_python(modules: tuple[str, ...] = ("psrv",)) -> dict[str, Any]:
    """The same description of the calling process's own interpreter (the driver's)."""
    return next(environment_probe(modules)(iter(())))
