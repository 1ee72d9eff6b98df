"""The two strategy interfaces of a residual encoder, open to a user's own classes.

A **threshold algorithm** picks tau for every encoding step; a **residual post-processor** changes the
residual after each step. psrv ships FixedThreshold, AdaptiveThreshold, TargetSparsityThreshold and
SampledQuantileThreshold (psrv.encoding.thresholds) and ResidualClipping and NoResidualPostProcessor
(psrv.encoding.postprocess), but any class with the members below works, on one machine and on Spark,
where the class itself travels to the executors (by value when it is defined in a script's ``__main__``
or a notebook) and every task rebuilds its own copy with ``from_state``.

State is a plain dict of msgpack/JSON-able values (numbers, strings, lists, dicts): it is broadcast to
the tasks, returned by them, averaged on the driver and written into checkpoints. ``from_state`` must
accept whatever ``get_state`` returns, so ``from_state(get_state())`` restores the object exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
from psrv.encoding.errors import InvalidStateError


@runtime_checkable
class ThresholdAlgorithm(Protocol):
    """Picks the threshold tau of each encoding step. Holds no clock: it advances once per ``observe``.

    Optional members the encoder uses where present: ``prepare(residual)`` sets tau from the residual
    before each encoding (the fused step paths then write the residual out first); ``sample_stride(n)``
    with ``prepare_sample(picked)`` promise that ``prepare(r)`` is ``prepare_sample(r[::sample_stride(n)])``,
    so those paths compute only the sampled elements (SampledQuantileThreshold). ``message_rule(n)``
    says in words what a message of a model of ``n`` parameters carries (the driver logs it).
    """

    #: the tau of the next step (positive and finite)
    threshold: float

    def observe(self, count: int, n: int) -> None:
        """The last step sent ``count`` of the residual's ``n`` elements; adapt ``threshold``."""
        ...

    def get_state(self) -> dict[str, Any]:
        """Settings and current tau as a msgpack/JSON-able dict (what ``from_state`` takes)."""
        ...

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ThresholdAlgorithm:
        """The algorithm ``get_state`` described (a task's copy, a resumed checkpoint's)."""
        ...

    @classmethod
    def average(cls, states: Iterable[Mapping[str, Any]]) -> ThresholdAlgorithm:
        """One algorithm from the workers' final states (the driver's after each epoch)."""
        ...


@runtime_checkable
class ResidualPostProcessor(Protocol):
    """Changes the residual after each encoding step (ResidualClipping bounds it)."""

    def process(self, residual: np.ndarray, threshold: float) -> None:
        """Change ``residual`` in place (a NumPy array, or a torch tensor when encoding on a device);
        ``threshold`` is the step's tau."""
        ...

    def get_state(self) -> dict[str, Any]:
        """Settings and counters as a msgpack/JSON-able dict (what ``from_state`` takes)."""
        ...

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ResidualPostProcessor:
        """The post-processor ``get_state`` described."""
        ...


#: every member each strategy needs, in the order an error names the first one missing
THRESHOLD_ALGORITHM_MEMBERS = ("threshold", "observe", "get_state", "from_state", "average")
POST_PROCESSOR_MEMBERS = ("process", "get_state", "from_state")


def missing_members(strategy: Any, members: Iterable[str]) -> list[str]:
    """The members of ``members`` that ``strategy`` lacks (attributes or callables)."""
    missing = []
    for name in members:
        value = getattr(strategy, name, None)
        if value is None or (name != "threshold" and not callable(value)):
            missing.append(name)
    return missing


def restore_strategy(cls: type, state: Mapping[str, Any], what: str) -> Any:
    """``cls.from_state(state)``, with any failure an InvalidStateError naming the class."""
    restore = getattr(cls, "from_state", None)
    if not callable(restore):
        raise InvalidStateError(f"{what}: {cls.__qualname__} has no classmethod from_state(state)")
    try:
        return restore(state)
    except InvalidStateError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's from_state may raise anything
        raise InvalidStateError(f"{what}: {cls.__qualname__}.from_state({dict(state)!r:.200}) failed: "
                                f"{type(exc).__name__}: {exc}") from exc


__all__ = [
    "POST_PROCESSOR_MEMBERS",
    "THRESHOLD_ALGORITHM_MEMBERS",
    "ResidualPostProcessor",
    "ThresholdAlgorithm",
    "missing_members",
    "restore_strategy",
]
