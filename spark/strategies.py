"""How a training master's encoding strategies travel: the classes by value, the objects as state.

A threshold algorithm or residual post-processor may be a user's own class (psrv.encoding.strategies),
defined in a script's ``__main__`` or a notebook, which the executors cannot import. So the driver
pickles the classes with cloudpickle (``__main__`` code by value, psrv's and installed classes by
reference, as PySpark ships closures) and sends each object's ``get_state()`` beside them; a task, or
a resumed checkpoint, rebuilds every object with ``cls.from_state(state)``. Records written without the
classes (older checkpoints) fall back to psrv's own classes, found by the state's ``type``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from psrv.encoding import post_processor_from_state, threshold_algorithm_from_state
from psrv.encoding.errors import InvalidStateError
from psrv.encoding.strategies import restore_strategy

#: what names each strategy in errors, and how a state without its class is rebuilt
THRESHOLD = ("threshold algorithm", threshold_algorithm_from_state)
POST_PROCESSOR = ("residual post-processor", post_processor_from_state)


def classes_to_bytes(strategies: Sequence[Any]) -> bytes:
    """The classes of ``strategies`` pickled the way PySpark ships code (``__main__`` by value)."""
    from pyspark import cloudpickle

    return cloudpickle.dumps(tuple(type(s) for s in strategies))


def classes_from_bytes(blob: bytes, count: int) -> tuple[type, ...]:
    """What ``classes_to_bytes`` wrote: ``count`` classes."""
    try:
        classes = pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - a class that cannot be rebuilt here is a state error
        raise InvalidStateError(f"the encoding strategies' classes cannot be unpickled here: "
                                f"{type(exc).__name__}: {exc}") from exc
    if not (isinstance(classes, tuple) and len(classes) == count
            and all(isinstance(c, type) for c in classes)):
        raise InvalidStateError(f"expected {count} strategy classes, got {classes!r:.200}")
    return classes


def rebuild(blob: bytes | None, states: Sequence[Mapping[str, Any]],
            kinds: Sequence[tuple[str, Callable[[Mapping[str, Any]], Any]]]) -> list[Any]:
    """Every strategy from its state: with its shipped class, else (no ``blob``) psrv's own classes."""
    if not blob:
        return [fallback(state) for state, (_, fallback) in zip(states, kinds, strict=True)]
    classes = classes_from_bytes(blob, len(states))
    return [restore_strategy(cls, state, what)
            for cls, state, (what, _) in zip(classes, states, kinds, strict=True)]


__all__ = ["POST_PROCESSOR", "THRESHOLD", "classes_from_bytes", "classes_to_bytes", "rebuild"]
