"""The file form of a TorchNetwork: one ``torch.save`` payload (a dict tagged with a format name and
version), written to and read from bytes; saving to a path is the caller's (psrv.nn._files)."""

from __future__ import annotations

import io
from typing import Any

from psrv.nn.errors import ModelFileError
from psrv.nn.torch_device import import_torch

__all__ = ["FORMAT", "FORMAT_VERSION", "dump_payload", "load_payload"]

FORMAT = "psrv.nn.TorchNetwork"
FORMAT_VERSION = 1


def dump_payload(payload: dict[str, Any], pickle_module: Any = None) -> bytes:
    """``payload`` (tagged here with the format and its version) as bytes. ``pickle_module`` (e.g.
    cloudpickle) lets code defined in ``__main__`` or a notebook travel by value."""
    torch = import_torch()
    tagged = {"format": FORMAT, "format_version": FORMAT_VERSION, **payload}
    buffer = io.BytesIO()
    if pickle_module is None:
        torch.save(tagged, buffer)
    else:
        torch.save(tagged, buffer, pickle_module=pickle_module, pickle_protocol=4)
    return buffer.getvalue()


def load_payload(data: bytes | bytearray | memoryview, source: str) -> dict[str, Any]:
    """The payload ``dump_payload`` wrote (tensors on the CPU); ``ModelFileError`` naming ``source`` for
    anything else or a format newer than this psrv reads."""
    torch = import_torch()
    try:
        payload = torch.load(io.BytesIO(bytes(data)), weights_only=False, map_location="cpu")
    except Exception as exc:
        raise ModelFileError(f"{source}: not a readable TorchNetwork file: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ModelFileError(f"{source}: not a TorchNetwork file (expected format {FORMAT!r})")
    if payload.get("format_version", 0) > FORMAT_VERSION:
        raise ModelFileError(f"{source}: TorchNetwork format {payload['format_version']} is too new")
    return payload
