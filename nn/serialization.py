"""Save and load a Network as ONE versioned file.

Layout (little endian):
    magic      8 bytes  b"\\x89PSRVNN\\n"
    version    uint32   FORMAT_VERSION
    header_len uint64
    header     JSON (utf-8): configuration, counters, normalizer state, array table (name, dtype,
               length, crc32)
    header_crc uint32   crc32 of the header bytes
    arrays     raw bytes, in the order of the array table (params, then updater_state)

A file that is not ours (wrong magic), newer than this code, cut short, or whose checksums do not
match raises a ModelFileError subclass naming what was expected and what was found.

This module knows the file, not the network class: ``psrv.nn.network`` registers how to build a
network from its stored configuration (:func:`register_network_type`), so that the network's own
``save``/``load`` can use this module without the two importing each other.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from psrv.nn._files import read_whole, write_atomically
from psrv.nn.errors import (
    ConfigError,
    ForeignFileError,
    ModelFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from psrv.nn.normalizers import normalizer_from_state

MAGIC = b"\x89PSRVNN\n"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIQ")
_CRC = struct.Struct("<I")
_NDARRAY_TAG = "__ndarray__"
_network_types: dict[str, Callable[[dict[str, Any]], Any]] = {}


def register_network_type(config_format: str, from_config: Callable[[dict[str, Any]], Any]) -> None:
    """How to rebuild a network whose stored configuration says ``"format": config_format``."""
    _network_types[config_format] = from_config


def _encode_state(value: Any) -> Any:
    """JSON-able form of a normalizer state: numpy arrays and scalars become tagged dicts / numbers."""
    if isinstance(value, np.ndarray):
        return {_NDARRAY_TAG: value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _encode_state(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode_state(v) for v in value]
    return value


def _decode_state(value: Any) -> Any:
    if isinstance(value, dict):
        if _NDARRAY_TAG in value:
            return np.asarray(value[_NDARRAY_TAG], dtype=value["dtype"]).reshape(value["shape"])
        return {k: _decode_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_state(v) for v in value]
    return value


def network_to_bytes(net: Any) -> bytes:
    arrays = [("params", net.params), ("updater_state", net.updater_state)]
    normalizer = net.normalizer.get_state() if net.normalizer is not None else None
    header = {
        "config": net.get_config(),
        "iteration": net.iteration,
        "epoch": net.epoch,
        "normalizer": _encode_state(normalizer),
        "arrays": [
            {"name": name, "dtype": arr.dtype.str, "length": int(arr.size), "crc32": zlib.crc32(arr.data)}
            for name, arr in arrays
        ],
    }
    header_bytes = json.dumps(header, allow_nan=False).encode("utf-8")
    parts = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)), header_bytes,
             _CRC.pack(zlib.crc32(header_bytes))]
    parts.extend(np.ascontiguousarray(arr).tobytes() for _, arr in arrays)
    return b"".join(parts)


def network_from_bytes(data: bytes | bytearray | memoryview, source: str = "buffer") -> Any:
    buf = memoryview(data).cast("B")
    if len(buf) < len(MAGIC) or bytes(buf[: len(MAGIC)]) != MAGIC:
        got = bytes(buf[: len(MAGIC)])
        if len(buf) < len(MAGIC) and MAGIC.startswith(got) and got:
            raise TruncatedFileError(f"{source}: truncated: {len(buf)} bytes, shorter than the file magic")
        raise ForeignFileError(f"{source}: not a psrv network file: expected magic {MAGIC!r}, got {got!r}")
    if len(buf) < _PREFIX.size:
        raise TruncatedFileError(
            f"{source}: truncated: expected at least {_PREFIX.size} bytes, got {len(buf)}"
        )
    _, version, header_len = _PREFIX.unpack_from(buf, 0)
    if version != FORMAT_VERSION:
        raise UnsupportedVersionError(
            f"{source}: network file format version {version}; this psrv reads version {FORMAT_VERSION}"
        )
    pos = _PREFIX.size
    if len(buf) < pos + header_len + _CRC.size:
        raise TruncatedFileError(
            f"{source}: truncated: header needs {pos + header_len + _CRC.size} bytes, file has {len(buf)}"
        )
    header_bytes = bytes(buf[pos : pos + header_len])
    pos += header_len
    (crc,) = _CRC.unpack_from(buf, pos)
    pos += _CRC.size
    if zlib.crc32(header_bytes) != crc:
        raise TruncatedFileError(f"{source}: corrupt: header checksum mismatch")
    try:
        header = json.loads(header_bytes.decode("utf-8"))
        table = header["arrays"]
        expected = pos + sum(np.dtype(a["dtype"]).itemsize * int(a["length"]) for a in table)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"{source}: unreadable header: {exc}") from exc
    if len(buf) < expected:
        raise TruncatedFileError(f"{source}: truncated: expected {expected} bytes, got {len(buf)}")
    if len(buf) > expected:
        raise ModelFileError(f"{source}: expected {expected} bytes, got {len(buf)} (trailing data)")
    arrays: dict[str, np.ndarray] = {}
    for entry in table:
        dtype = np.dtype(entry["dtype"])
        nbytes = dtype.itemsize * int(entry["length"])
        chunk = buf[pos : pos + nbytes]
        if zlib.crc32(chunk) != entry["crc32"]:
            raise TruncatedFileError(f"{source}: corrupt: checksum mismatch in array {entry['name']!r}")
        arrays[entry["name"]] = np.frombuffer(chunk, dtype=dtype)
        pos += nbytes
    config = header.get("config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt not in _network_types:
        raise ModelFileError(f"{source}: the stored configuration is invalid: not a network configuration "
                             f"psrv knows (format {fmt!r}; known: {sorted(_network_types)})")
    try:
        net = _network_types[fmt](config)
    except ConfigError as exc:
        raise ModelFileError(f"{source}: the stored configuration is invalid: {exc}") from exc
    try:
        net.set_params(arrays["params"])
        net.set_updater_state(arrays["updater_state"])
        net.iteration = int(header.get("iteration", 0))
        net.epoch = int(header.get("epoch", 0))
    except (KeyError, ValueError) as exc:
        raise ModelFileError(f"{source}: stored arrays do not match the configuration: {exc}") from exc
    if header.get("normalizer") is not None:
        net.normalizer = normalizer_from_state(_decode_state(header["normalizer"]))
    return net


def save_network(net: Any, path: str | os.PathLike[str]) -> None:
    write_atomically(path, network_to_bytes(net))


def load_network(path: str | os.PathLike[str]) -> Any:
    path = os.fspath(path)
    try:
        data = read_whole(path)
    except OSError as exc:
        raise ModelFileError(f"cannot read network file {path!r}: {exc}") from exc
    return network_from_bytes(data, source=path)


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "load_network",
    "network_from_bytes",
    "network_to_bytes",
    "register_network_type",
    "save_network",
]
