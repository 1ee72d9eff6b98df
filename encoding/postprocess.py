"""Residual post-processors: what happens to the residual after each encoding step.

``ResidualClipping(multiple=5.0, every=5)`` clips the residual to +-multiple*tau on every
``every``-th step (steps 5, 10, 15, ... by default), so a residual that grows faster than it is sent
cannot blow up (DL4J's ResidualClippingPostProcessor). ``NoResidualPostProcessor`` leaves it alone.
Both count steps themselves and serialize that count with their settings. Each meets the
ResidualPostProcessor Protocol (psrv.encoding.strategies), which a user's own class may meet as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from psrv.encoding.codec import float32_threshold
from psrv.encoding.errors import InvalidStateError
from psrv.encoding.strategies import ResidualPostProcessor


class NoResidualPostProcessor:
    """Leaves the residual as the encoder left it."""

    def process(self, residual: np.ndarray, threshold: float) -> None:
        return None

    def get_state(self) -> dict[str, Any]:
        return {"type": type(self).__name__}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> NoResidualPostProcessor:
        return _restored(cls, state)

    def __repr__(self) -> str:
        return "NoResidualPostProcessor()"


class ResidualClipping:
    """Every ``every``-th call, clip the residual in place to [-multiple*tau, +multiple*tau]."""

    def __init__(self, multiple: float = 5.0, every: int = 5) -> None:
        multiple = float(multiple)
        if not (math.isfinite(multiple) and multiple > 0):
            raise ValueError(f"multiple must be positive and finite, got {multiple!r}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        self.multiple = multiple
        self.every = every
        self.steps = 0

    def process(self, residual: Any, threshold: float) -> None:
        """Count one step; on every ``every``-th, clip (tau rounded to float32, as the encoder uses it)."""
        if self.due_limit(threshold) is None:
            return
        tau = float(float32_threshold(threshold))
        if isinstance(residual, np.ndarray):
            limit = residual.dtype.type(self.multiple * tau)
            np.clip(residual, -limit, limit, out=residual)
        else:  # a torch tensor (psrv.encoding.device): the same limit, rounded to its dtype first
            limit = float(np.float32(self.multiple * tau) if str(residual.dtype) == "torch.float32"
                          else self.multiple * tau)
            residual.clamp_(-limit, limit)

    def upcoming_limit(self, threshold: float) -> float | None:
        """The clipping limit (multiple * float32 tau) when the next step clips, else None; counts
        nothing. For a caller that clips the residual its own way (an implicit residual is clipped
        inside its encoding pass by moving the step buffer), then counts the step with ``due_limit``."""
        if (self.steps + 1) % self.every:
            return None
        return self.multiple * float(float32_threshold(threshold))

    def due_limit(self, threshold: float) -> float | None:
        """Count one step; the clipping limit when this step clips, else None (``process`` without the
        residual)."""
        limit = self.upcoming_limit(threshold)
        self.steps += 1
        return limit

    def get_state(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "multiple": self.multiple, "every": self.every,
                "steps": self.steps}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ResidualClipping:
        return _restored(cls, state)

    def __repr__(self) -> str:
        return f"ResidualClipping(multiple={self.multiple!r}, every={self.every!r})"


def post_processor_from_state(state: Mapping[str, Any]) -> ResidualClipping | NoResidualPostProcessor:
    """Rebuild a post-processor from ``get_state()``."""
    kind = state.get("type") if isinstance(state, Mapping) else None
    if kind == "NoResidualPostProcessor":
        return NoResidualPostProcessor()
    if kind == "ResidualClipping":
        try:
            processor = ResidualClipping(state["multiple"], state["every"])
            processor.steps = int(state.get("steps", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidStateError(f"cannot restore ResidualClipping from {dict(state)!r}: {exc}") from None
        return processor
    raise InvalidStateError(f"unknown residual post-processor state {state!r}")


def _restored(cls: type, state: Mapping[str, Any]) -> Any:
    """``post_processor_from_state(state)``, which must be of class ``cls``."""
    processor = post_processor_from_state(state)
    if type(processor) is not cls:
        raise InvalidStateError(f"state is for {type(processor).__name__}, not {cls.__name__}")
    return processor


__all__ = [
    "NoResidualPostProcessor",
    "ResidualClipping",
    "ResidualPostProcessor",
    "post_processor_from_state",
]
