"""An O(1) structural check of an encoded update, so the hot path never scans a payload twice.

``psrv.encoding.message_info`` validates the whole body (as fast as memory, yet as costly as the
wire itself for a 1 MB message). The transport only needs the header to route and count; the
body is validated in full where it is used, by ``decode`` (whose MalformedMessageError is then
counted as a ``bad_payload`` rejection and leaves the parameters untouched).

Wire forms, as documented by psrv.encoding.codec (int32, little-endian):
sparse ``[count, n, float32-bits(tau), 0]`` + count indices; bitmap ``[n, n, bits(tau), 1]`` +
ceil(n / 16) words.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from psrv.transport.errors import FrameRejectedError

HEADER_WORDS = 4
WORD_ELEMENTS = 16
FORMS = {0: "sparse", 1: "bitmap"}
_I32 = struct.Struct("<i")
_F32 = struct.Struct("<f")


@dataclass(frozen=True)
class PayloadInfo:
    form: str
    count: int
    n: int
    tau: float


def header_info(payload: np.ndarray, size: int, what: str, max_tau: float = math.inf) -> PayloadInfo:
    """Header fields of an int32 message after checking its form, length, tau and model size."""
    if payload.shape[0] < HEADER_WORDS:
        raise FrameRejectedError(
            "bad_payload", f"{what}: {payload.shape[0]} int32 words, a header alone is 4"
        )
    first, n, tau_bits, form = payload[:HEADER_WORDS].tolist()
    tau = _F32.unpack(_I32.pack(tau_bits))[0]
    name = FORMS.get(form)
    if name is None:
        raise FrameRejectedError(
            "bad_payload", f"{what}: unknown form {form} (expected 0 sparse or 1 bitmap)"
        )
    if not (math.isfinite(tau) and tau > 0):
        raise FrameRejectedError("bad_payload", f"{what}: threshold must be positive and finite, got {tau!r}")
    if tau > max_tau:
        raise FrameRejectedError(
            "bad_payload", f"{what}: threshold {tau:g} > max_tau {max_tau:g} (TransportConfig.max_tau)"
        )
    if n != size:
        raise FrameRejectedError("bad_payload", f"{what} is for {n} parameters, this model has {size}")
    body = payload.shape[0] - HEADER_WORDS
    expected = first if form == 0 else (n + WORD_ELEMENTS - 1) // WORD_ELEMENTS
    if (form == 1 and first != n) or first < 0 or body != expected:
        raise FrameRejectedError(
            "bad_payload",
            f"{what}: {name} message of {body} body words, header says {expected} (count {first}, n {n})",
        )
    return PayloadInfo(name, first if form == 0 else n, n, tau)


def check_payload(
    payload: Any, size: int, what: str, max_tau: float = math.inf
) -> tuple[np.ndarray, PayloadInfo]:
    """An encoded message as an int32 array plus its header fields, checked against a model of ``size``."""
    if not isinstance(payload, np.ndarray) or payload.dtype != np.int32 or payload.ndim != 1:
        desc = (
            f"{payload.dtype}{list(payload.shape)}"
            if isinstance(payload, np.ndarray)
            else type(payload).__name__
        )
        raise FrameRejectedError("bad_payload", f"{what}: expected a 1-D int32 encoded message, got {desc}")
    payload = np.ascontiguousarray(payload)
    return payload, header_info(payload, size, what, max_tau)
