"""The one intake of received updates: check a row, let only its first arrival through, apply it once.

The controller's master copy, the node, the device path (parameters on a GPU) and the simulation all
take updates through these functions, so a row is judged the same way everywhere: a row that does not
fit the model is a ``FrameRejectedError`` (counted by the caller), a repeat is a counted duplicate,
and an update that does not decode leaves the parameters untouched and is refused as ``bad_payload``.
Each caller keeps its own order of the membership checks around them (who may relay which origin).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import psrv.encoding as encoding
from psrv.encoding.errors import MalformedMessageError
from psrv.server.dedup import SeenUpdates
from psrv.server.updates import check_payload
from psrv.transport.codec import as_buffer
from psrv.transport.counters import Counters
from psrv.transport.errors import FrameRejectedError

__all__ = ["ApplyHook", "Decoder", "apply_once", "check_row", "decode_or_reject", "first_arrival"]

#: ``apply(payload, header)``: applies one update where the live parameters are (raises FrameRejectedError)
ApplyHook = Callable[[np.ndarray, dict], None]
#: ``decode(payload, target)``: adds an encoded update into ``target`` (host or device parameters)
Decoder = Callable[[Any, Any], Any]


def check_row(fields: dict, buffer: Any, seen: SeenUpdates, params_size: int, max_tau: float) -> np.ndarray:
    """The row's payload as int32 words checked against a model of ``params_size`` values; raises
    FrameRejectedError for a sequence too far ahead of what arrived or a payload that does not fit."""
    origin, seq = fields["origin"], fields["seq"]
    if seen.too_far(origin, seq):
        raise FrameRejectedError(
            "bad_sequence", f"update {origin}/{seq} is more than {seen.window} ahead of what arrived"
        )
    view = as_buffer(buffer)
    if view.nbytes % 4:
        raise FrameRejectedError(
            "bad_payload", f"update {origin}/{seq}: {view.nbytes} bytes is not a whole number of int32 words"
        )
    words = np.frombuffer(view, dtype=np.int32)
    return check_payload(words, params_size, f"update {origin}/{seq}", max_tau)[0]


def first_arrival(fields: dict, seen: SeenUpdates, counters: Counters) -> bool:
    """True the first time ``(origin, seq)`` arrives; a repeat is counted as a dropped duplicate."""
    counters.add("updates_received")
    if seen.first_time(fields["origin"], fields["seq"]):
        return True
    counters.add("duplicates_dropped")
    return False


def decode_or_reject(decode: Decoder, payload: Any, target: Any, header: dict) -> None:
    """Decode one update into ``target``; a malformed one is refused as ``bad_payload``."""
    try:
        decode(payload, target)
    except MalformedMessageError as exc:
        raise FrameRejectedError(
            "bad_payload", f"update {header.get('origin')}/{header.get('seq')}: {exc}"
        ) from None


def apply_once(
    payload: np.ndarray,
    fields: dict,
    *,
    hook: ApplyHook | None,
    params: np.ndarray,
    lock: AbstractContextManager[Any] | None = None,
) -> None:
    """Apply an update that passed ``first_arrival``: through ``hook`` when the live parameters are
    elsewhere, else decoded into ``params`` (under ``lock`` when given: a caller that does not hold
    it already). Raises FrameRejectedError("bad_payload")."""
    if hook is not None:
        hook(payload, fields)
        return
    with lock if lock is not None else contextlib.nullcontext():
        decode_or_reject(encoding.decode, payload, params, fields)
