"""The header of an encoded update, defined once: what the transport carries beside each payload
and what it may check of the payload without reading its body.

An update travels as six header fields plus one payload (an int32 message of ``psrv.encoding.codec``):

* ``origin`` (int, 1 .. 2**63 - 1): the member id that produced it;
* ``seq`` (int, 1 .. 2**63 - 1): its sequence number at that origin;
* ``iteration``, ``epoch`` (int, -(2**63 - 1) .. 2**63 - 1): the producer's step, as it says;
* ``tau`` (int or float, positive and finite): the payload's threshold, as a Python number;
* ``encoding`` (str): the payload's form, ``"sparse"``, ``"bitmap"`` or ``"packed"``.

Each row of UPDATES carries them as a list in ``FIELD_NAMES`` order (a lone update too: an UPDATES of
one row); UPDATE, still accepted, carries them as header fields by name. The payload's own 4-word
header (count or N, N, float32 bits of tau, form) is checked in O(1) against the model (its size,
``max_tau``) by ``payload_header``; the body is validated in full where it is used, by ``decode``.
The transport asks this module (``psrv.transport.messages`` for the catalogue, ``psrv.server.updates``
for batching and payloads); it never parses either header itself.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from psrv.encoding.errors import MalformedMessageError

#: the payload: ``[count, N, float32-bits(tau), SPARSE]`` + count indices, or
#: ``[N, N, float32-bits(tau), BITMAP]`` + ``bitmap_words(N)`` words of WORD_ELEMENTS elements each, or
#: ``[count, N, float32-bits(tau), PACKED]`` + the count elements' index gaps and signs in a Golomb-Rice
#: bit stream after its 5-bit parameter (zero-padded to a whole word: see ``psrv.encoding.codec``)
HEADER_WORDS = 4
WORD_ELEMENTS = 16
SPARSE = 0
BITMAP = 1
PACKED = 2
FORM_NAMES = {SPARSE: "sparse", BITMAP: "bitmap", PACKED: "packed"}
#: the largest Rice parameter of a packed body (5 bits; every gap is below 2**31)
MAX_RICE_K = 31
#: bits of a packed body's first field, its Rice parameter
RICE_K_BITS = 5
#: most bits one packed element takes besides its unary quotient: the zero ending it, a remainder of
#: up to MAX_RICE_K bits and the sign
PACKED_MAX_ELEMENT_BITS = MAX_RICE_K + 2
INT64_MAX = 2**63 - 1
_NEG64 = -INT64_MAX
_INF = math.inf

#: the six header fields of one update, in the order of an UPDATES row
FIELD_NAMES: tuple[str, ...] = ("origin", "seq", "iteration", "epoch", "tau", "encoding")
#: the Python types msgpack may decode each field to (a bool is never an int here)
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "origin": (int,),
    "seq": (int,),
    "iteration": (int,),
    "epoch": (int,),
    "tau": (int, float),
    "encoding": (str,),
}
#: closed ranges of the int fields
FIELD_BOUNDS: dict[str, tuple[int, int]] = {
    "origin": (1, INT64_MAX),
    "seq": (1, INT64_MAX),
    "iteration": (_NEG64, INT64_MAX),
    "epoch": (_NEG64, INT64_MAX),
}
ENCODINGS = frozenset(FORM_NAMES.values())


class MalformedHeaderError(MalformedMessageError):
    """An update's header fields (origin, seq, iteration, epoch, tau, encoding) are not what the wire
    allows: a missing field, a wrong type, a value out of range or a row of the wrong length."""


@dataclass(frozen=True, slots=True)
class UpdateHeader:
    """The checked header fields of one update."""

    origin: int
    seq: int
    iteration: int
    epoch: int
    tau: float
    encoding: str

    def fields(self) -> dict[str, Any]:
        """The header as UPDATE carries it (a map in ``FIELD_NAMES`` order)."""
        return {name: getattr(self, name) for name in FIELD_NAMES}

    def row(self) -> list[Any]:
        """The header as one row of UPDATES."""
        return [getattr(self, name) for name in FIELD_NAMES]


def _is_int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def check_fields(
    origin: object, seq: object, iteration: object, epoch: object, tau: object, encoding: object
) -> None:
    """Raise MalformedHeaderError unless these are the valid header fields of one update (the hot path:
    one chained comparison when everything is right; the details only to name a problem)."""
    if (
        type(origin) is int
        and type(seq) is int
        and type(iteration) is int
        and type(epoch) is int
        and (type(tau) is float or type(tau) is int)
        and 0 < origin <= INT64_MAX
        and 0 < seq <= INT64_MAX
        and _NEG64 <= iteration <= INT64_MAX
        and _NEG64 <= epoch <= INT64_MAX
        and 0 < tau < _INF
        and encoding in ENCODINGS
    ):
        return
    if not (_is_int(origin, 1, INT64_MAX) and _is_int(seq, 1, INT64_MAX)):
        raise MalformedHeaderError(f"update origin/seq must be ints >= 1, got {origin!r:.40}/{seq!r:.40}")
    if not (_is_int(iteration, _NEG64, INT64_MAX) and _is_int(epoch, _NEG64, INT64_MAX)):
        raise MalformedHeaderError(
            f"iteration/epoch must be 64-bit ints, got {iteration!r:.40}/{epoch!r:.40}"
        )
    if type(tau) not in (int, float) or not (math.isfinite(tau) and tau > 0):
        raise MalformedHeaderError(f"tau must be a positive finite number, got {tau!r:.40}")
    raise MalformedHeaderError(f"encoding must be one of {sorted(ENCODINGS)}, got {encoding!r:.40}")


def check_row(row: object) -> None:
    """Raise MalformedHeaderError unless ``row`` is one valid UPDATES row."""
    if not (isinstance(row, list | tuple) and len(row) == len(FIELD_NAMES)):
        raise MalformedHeaderError(
            f"a row must be [{', '.join(FIELD_NAMES)}], got {row!r:.80}"
        )
    check_fields(*row)


def row_fields(row: list | tuple) -> dict[str, Any]:
    """An UPDATES row (already checked) as the field map an UPDATE carries."""
    return dict(zip(FIELD_NAMES, row, strict=True))


def fields_row(fields: dict[str, Any]) -> list[Any]:
    """An UPDATE's field map as one UPDATES row."""
    return [fields[name] for name in FIELD_NAMES]


def parse_fields(fields: dict[str, Any]) -> UpdateHeader:
    """Check an UPDATE's field map (exactly the six fields) and return it typed."""
    if not isinstance(fields, dict) or fields.keys() != set(FIELD_NAMES):
        got = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise MalformedHeaderError(f"an update header holds exactly {list(FIELD_NAMES)}, got {got}")
    row = fields_row(fields)
    check_fields(*row)
    return UpdateHeader(*row)


def parse_row(row: object) -> UpdateHeader:
    """Check one UPDATES row and return it typed."""
    check_row(row)
    return UpdateHeader(*row)  # type: ignore[misc]


# ------------------------------------------------------------------------------------ the payload

_I32 = struct.Struct("<i")
_F32_FROM_BITS = struct.Struct("<f")


def packed_body_bytes(count: int, n: int) -> tuple[int, int]:
    """The fewest and most bytes a packed body of ``count`` elements of N = ``n`` takes before its zero
    padding: the parameter's 5 bits, then at least 2 bits an element (k = 0, consecutive indices), at
    most 33 bits an element plus the unary quotients, which together count at most n ones."""
    return ((RICE_K_BITS + 2 * count + 7) // 8,
            (RICE_K_BITS + PACKED_MAX_ELEMENT_BITS * count + n + 7) // 8)


def packed_message_bytes_bound(count: int, n: int) -> int:
    """The most bytes a message of ``count`` of ``n`` elements takes once packed (header included): the
    Rice code with the parameter that packs it into the fewest bits never takes more than any k's
    ``5 + count * (k + 2) + (n - count) // 2**k`` bits, as the gaps less one sum to at most n - count;
    ``compact`` keeps the sparse or bitmap form only where that is smaller still. A threshold that
    budgets bytes (``SampledQuantileThreshold(byte_budget=)``) asks it before it chooses a count."""
    if count <= 0:
        return 4 * HEADER_WORDS
    spare = max(0, n - count)
    bits = min(RICE_K_BITS + count * (k + 2) + (spare >> k) for k in range(MAX_RICE_K + 1))
    return 4 * (HEADER_WORDS + (bits + 31) // 32)


def bitmap_words(n: int) -> int:
    """Number of bitmap words for a vector of n elements."""
    return (n + WORD_ELEMENTS - 1) // WORD_ELEMENTS


def check_too_short(length: int) -> None:
    if length < HEADER_WORDS:
        raise MalformedMessageError(f"message has {length} int32 words; a header alone is {HEADER_WORDS}")


def check_header(header: list[int], length: int) -> float:
    """Check a payload's header words and total length (in int32 words) against each other; return tau.

    The one place the payload header rules live: the numba codec, the torch codec
    (psrv.encoding.device) and ``payload_header`` (the transport's O(1) check) call it before anything
    looks at the body.
    """
    first, n, tau_bits, form = header
    tau = _F32_FROM_BITS.unpack(_I32.pack(tau_bits))[0]
    if not (math.isfinite(tau) and tau > 0):
        raise MalformedMessageError(f"header threshold must be a positive finite float32, got {tau!r}")
    if n < 0:
        raise MalformedMessageError(f"header length N must be >= 0, got {n}")
    if form == SPARSE:
        if first < 0:
            raise MalformedMessageError(f"sparse header count must be >= 0, got {first}")
        if length != HEADER_WORDS + first:
            raise MalformedMessageError(f"sparse message has {length - HEADER_WORDS} indices but its "
                                        f"header says {first}")
    elif form == BITMAP:
        if first != n:
            raise MalformedMessageError(f"bitmap header must repeat N in its first word, got {first} and {n}")
        words = bitmap_words(n)
        if length != HEADER_WORDS + words:
            raise MalformedMessageError(f"bitmap message has {length - HEADER_WORDS} words; N={n} "
                                        f"needs {words}")
    elif form == PACKED:
        body = 4 * (length - HEADER_WORDS)
        if not 0 <= first <= n:
            raise MalformedMessageError(f"packed header count must be in [0, N={n}], got {first}")
        least, most = packed_body_bytes(first, n)
        if not least <= body <= most + 3:
            raise MalformedMessageError(
                f"packed message has {body} body bytes; {first} elements of N={n} take {least} to "
                f"{most} (plus < 4 of padding)")
    else:
        raise MalformedMessageError(
            f"unknown message form {form} (expected 0 = sparse, 1 = bitmap or 2 = packed)")
    return tau


@dataclass(frozen=True, slots=True)
class PayloadHeader:
    """What the 4-word header of a payload says, checked against the body's length and a model.

    ``count`` is the number of elements carrying +-tau for the sparse and packed forms; for the bitmap
    form it would take a scan of the body, so it is None."""

    form: str
    n: int
    tau: float  # the float32 threshold, as a Python float
    count: int | None


def payload_header(payload: np.ndarray, size: int, max_tau: float = _INF) -> PayloadHeader:
    """The header of a 1-D int32 payload after an O(1) check of its form, length, tau, the model
    size (``size`` parameters) and ``max_tau``. Raises MalformedMessageError naming the problem."""
    length = payload.shape[0]
    check_too_short(length)
    first, n, tau_bits, form = header = payload[:HEADER_WORDS].tolist()
    tau = check_header(header, length)
    if tau > max_tau:
        raise MalformedMessageError(f"threshold {tau:g} > max_tau {max_tau:g} (TransportConfig.max_tau)")
    if n != size:
        raise MalformedMessageError(f"update is for {n} parameters, this model has {size}")
    return PayloadHeader(FORM_NAMES[form], n, tau, None if form == BITMAP else first)


def as_payload(payload: object) -> np.ndarray:
    """``payload`` as a C-contiguous 1-D int32 array; MalformedMessageError for anything else."""
    if not isinstance(payload, np.ndarray) or payload.dtype != np.int32 or payload.ndim != 1:
        desc = (
            f"{payload.dtype}{list(payload.shape)}"
            if isinstance(payload, np.ndarray)
            else type(payload).__name__
        )
        raise MalformedMessageError(f"expected a 1-D int32 encoded message, got {desc}")
    return np.ascontiguousarray(payload)


def check_payload_nbytes(nbytes: int) -> None:
    """A payload frame is a whole, non-empty number of int32 words (before anything else is read)."""
    if nbytes == 0 or nbytes % 4:
        raise MalformedMessageError(f"update payload must be a non-empty int32 array, got {nbytes} bytes")


__all__ = [
    "BITMAP",
    "ENCODINGS",
    "FIELD_BOUNDS",
    "FIELD_NAMES",
    "FIELD_TYPES",
    "FORM_NAMES",
    "HEADER_WORDS",
    "INT64_MAX",
    "MAX_RICE_K",
    "PACKED",
    "PACKED_MAX_ELEMENT_BITS",
    "RICE_K_BITS",
    "SPARSE",
    "WORD_ELEMENTS",
    "MalformedHeaderError",
    "PayloadHeader",
    "UpdateHeader",
    "as_payload",
    "bitmap_words",
    "check_fields",
    "check_header",
    "check_payload_nbytes",
    "check_row",
    "check_too_short",
    "fields_row",
    "packed_body_bytes",
    "packed_message_bytes_bound",
    "parse_fields",
    "parse_row",
    "payload_header",
    "row_fields",
]
