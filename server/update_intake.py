"""The one intake of received updates: check a row, let only its first arrival through, apply it once.

The controller's master copy, the node, the device path (parameters on a GPU) and the simulation all
take updates through these functions, so a row is judged the same way everywhere: a row that does not
fit the model (its header, its length or any word of its body) is a ``FrameRejectedError`` (counted by
the caller) before it is deduplicated, relayed or applied; a repeat is a counted duplicate. What passed
``check_row`` cannot fail to apply on the message's account: the machines either decode it into their
own ``params`` (``apply_checked``) or hand it to their facade as an ``Apply`` action.
Each caller keeps its own order of the membership checks around them (who may relay which origin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import psrv.encoding as encoding
from psrv.encoding.errors import MalformedMessageError
from psrv.server.dedup import SeenUpdates
from psrv.server.updates import check_payload
from psrv.transport.codec import as_buffer
from psrv.transport.counters import Counters
from psrv.transport.errors import FrameRejectedError

__all__ = ["Decoder", "apply_checked", "check_row", "decode_or_reject", "first_arrival"]

#: ``decode(payload, target)``: adds an encoded update into ``target`` (host or device parameters)
Decoder = Callable[[Any, Any], Any]


def check_row(fields: dict, buffer: Any, seen: SeenUpdates, params_size: int, max_tau: float) -> np.ndarray:
    """The row's payload as int32 words checked whole (header, length, body) against a model of
    ``params_size`` values; raises FrameRejectedError for a sequence too far ahead of what arrived or
    a payload that does not fit.

    A packed payload comes back unpacked (the sparse message of the same elements): its bit stream is
    walked once, here, and what is applied, held or replayed later is the sparse form. Relays forward
    the received buffer, still packed."""
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
    what = f"update {origin}/{seq}"
    payload = check_payload(words, params_size, what, max_tau)[0]
    try:
        payload = encoding.parse_message(payload)[0]  # the body too: what passes applies without a failure
    except MalformedMessageError as exc:
        raise FrameRejectedError("bad_payload", f"{what}: {exc}") from None
    return payload


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


def apply_checked(payload: np.ndarray, params: np.ndarray) -> None:
    """Add an update that passed ``check_row`` and ``first_arrival`` into ``params`` (the caller holds
    the facade's lock); its body is not walked a second time."""
    encoding.decode_validated(payload, params)
