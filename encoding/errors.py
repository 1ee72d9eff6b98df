"""Errors raised by psrv.encoding; every one derives from one base class.

None of them is retryable: the same input fails the same way again. ``retryable`` says so in the type,
like the other packages' errors.
"""

from __future__ import annotations

from typing import ClassVar


class EncodingError(Exception):
    """Base class of every error raised by psrv.encoding."""

    retryable: ClassVar[bool] = False


class MalformedMessageError(EncodingError, ValueError):
    """An encoded message is not what the wire format allows; it was rejected and nothing was applied."""


class NonFiniteResidualError(EncodingError, ArithmeticError):
    """The residual holds NaN or inf (training diverged); nothing was emitted, the residual is untouched.

    ``index`` is the first bad position and ``value`` the value found there.
    """

    def __init__(self, index: int, value: float) -> None:
        super().__init__(
            f"residual holds a non-finite value {value!r} at index {index} (the first one); "
            "nothing was encoded and the residual is unchanged"
        )
        self.index = index
        self.value = value


class InvalidStateError(EncodingError, ValueError):
    """A serialized threshold algorithm or post-processor state cannot be restored or averaged."""


__all__ = [
    "EncodingError",
    "InvalidStateError",
    "MalformedMessageError",
    "NonFiniteResidualError",
]
