"""The psrv data file form: named numeric arrays in one versioned, checksummed blob.

Layout (one minibatch per file)::

    8 bytes  magic b"PSRVDATA"
    4 bytes  format version (uint32, little endian)
    4 bytes  header length H (uint32, little endian)
    H bytes  header: UTF-8 JSON {"kind", "arrays": [{name, dtype, shape, offset, nbytes}],
             "payload_bytes", "crc32"}
    payload  the raw little-endian arrays, back to back

A truncated, corrupt (CRC mismatch), foreign or newer-version file raises ``DataFileError``.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
from psrv.nn._files import read_whole, write_atomically
from psrv.nn.data_common import NUMERIC_KINDS
from psrv.nn.errors import DataFileError

DATA_FILE_MAGIC = b"PSRVDATA"
DATA_FILE_VERSION = 1
DATA_FILE_SUFFIX = ".psds"
_PREAMBLE = struct.Struct("<8sII")
_MAX_HEADER_BYTES = 16 * 1024 * 1024


def encode_arrays(kind: str, arrays: list[tuple[str, np.ndarray]]) -> bytes:
    """The psrv file form for any named numeric arrays (used by other batch kinds, e.g. image batches)."""
    entries = []
    chunks = []
    offset = 0
    for name, array in arrays:
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        raw = little.tobytes()
        entries.append(
            {
                "name": name,
                "dtype": little.dtype.str,
                "shape": list(little.shape),
                "offset": offset,
                "nbytes": len(raw),
            }
        )
        chunks.append(raw)
        offset += len(raw)
    payload = b"".join(chunks)
    header = json.dumps(
        {"kind": kind, "arrays": entries, "payload_bytes": len(payload), "crc32": zlib.crc32(payload)},
        separators=(",", ":"),
    ).encode("utf-8")
    return _PREAMBLE.pack(DATA_FILE_MAGIC, DATA_FILE_VERSION, len(header)) + header + payload


def decode_arrays(
    blob: bytes | bytearray | memoryview, source: str = "<bytes>"
) -> tuple[str, dict[str, np.ndarray]]:
    """(kind, arrays) of a psrv data file, fully checked; raises DataFileError."""
    view = memoryview(blob).cast("B")
    if len(view) < _PREAMBLE.size:
        raise DataFileError(
            f"{source}: not a psrv data file: {len(view)} bytes, shorter than the {_PREAMBLE.size}-byte "
            "preamble (truncated?)"
        )
    magic, version, header_len = _PREAMBLE.unpack_from(view, 0)
    if magic != DATA_FILE_MAGIC:
        raise DataFileError(
            f"{source}: not a psrv data file: expected magic {DATA_FILE_MAGIC!r}, got {magic!r}"
        )
    if version != DATA_FILE_VERSION:
        raise DataFileError(
            f"{source}: unsupported psrv data file version {version}; this build reads version "
            f"{DATA_FILE_VERSION}"
        )
    if header_len > _MAX_HEADER_BYTES or _PREAMBLE.size + header_len > len(view):
        raise DataFileError(
            f"{source}: truncated psrv data file: header of {header_len} bytes announced, "
            f"{len(view) - _PREAMBLE.size} bytes follow the preamble"
        )
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : _PREAMBLE.size + header_len]).decode("utf-8"))
        kind = str(header["kind"])
        entries = list(header["arrays"])
        payload_bytes = int(header["payload_bytes"])
        crc = int(header["crc32"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataFileError(f"{source}: corrupt psrv data file header ({exc})") from exc
    start = _PREAMBLE.size + header_len
    payload = view[start:]
    if len(payload) != payload_bytes:
        what = "truncated" if len(payload) < payload_bytes else "over-long"
        raise DataFileError(
            f"{source}: {what} psrv data file: expected {payload_bytes} payload bytes, got {len(payload)}"
        )
    if zlib.crc32(payload) != crc:
        raise DataFileError(f"{source}: corrupt psrv data file: payload checksum mismatch")
    arrays: dict[str, np.ndarray] = {}
    try:
        for entry in entries:
            dtype = np.dtype(entry["dtype"])
            if dtype.kind not in NUMERIC_KINDS:
                raise DataFileError(f"{source}: refusing array {entry['name']!r} of dtype {dtype}")
            shape = tuple(int(s) for s in entry["shape"])
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
            if (
                nbytes != dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                or offset < 0
                or (offset + nbytes > payload_bytes)
            ):
                raise DataFileError(
                    f"{source}: corrupt psrv data file: array {entry['name']!r} out of bounds"
                )
            data = np.frombuffer(payload[offset : offset + nbytes], dtype=dtype).reshape(shape)
            arrays[str(entry["name"])] = data.astype(dtype.newbyteorder("="), copy=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataFileError(f"{source}: corrupt psrv data file header ({exc})") from exc
    return kind, arrays


def write_file_bytes(path: str | os.PathLike[str], blob: bytes) -> None:
    """Write a data file atomically (readers never see half a file); any path the storage layer reaches."""
    write_atomically(path, blob, make_parents=True)


def read_file_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a data file (local path, ``file:`` or any storage-layer URI); raises DataFileError."""
    try:
        return read_whole(path)
    except OSError as exc:
        raise DataFileError(f"{os.fspath(path)}: cannot read data file ({exc})") from exc


__all__ = [
    "DATA_FILE_MAGIC",
    "DATA_FILE_SUFFIX",
    "DATA_FILE_VERSION",
    "decode_arrays",
    "encode_arrays",
    "read_file_bytes",
    "write_file_bytes",
]
