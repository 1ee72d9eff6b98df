"""CurveZMQ key sets: generate, write to a directory, read back (the socket wiring is the runtime's).

One key set serves a whole job: the controller uses the server pair and accepts only the client
public key; nodes use the client pair and the server public key. Keys are Z85 text as
``zmq.curve_keypair()`` returns them (40 bytes each), stored one per file:

    DIR/server.public  DIR/server.secret  DIR/client.public  DIR/client.secret

The directory is created with mode 0700 and each file with mode 0600 (owner only).
``read_keys`` checks that every file is present, well formed, and that each secret key matches
its public key, and says which file is wrong otherwise.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, fields
from pathlib import Path

import zmq
from psrv.transport.errors import KeyFileError
from zmq.utils import z85

__all__ = ["KeySet", "KEY_FILES", "generate_keys", "write_keys", "read_keys"]

log = logging.getLogger(__name__)

KEY_FILES = {
    "server_public": "server.public",
    "server_secret": "server.secret",
    "client_public": "client.public",
    "client_secret": "client.secret",
}
_Z85_LEN = 40


@dataclass
class KeySet:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    def __repr__(self) -> str:  # never print secrets into logs
        return (
            f"KeySet(server_public={self.server_public!r}, client_public={self.client_public!r}, secrets=***)"
        )


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise KeyFileError("this libzmq was built without CURVE support; keys cannot be generated or used")


def generate_keys() -> KeySet:
    """A fresh server pair and client pair."""
    _require_curve()
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return KeySet(server_public, server_secret, client_public, client_secret)


def _check_key(name: str, value: object, where: str) -> bytes:
    if isinstance(value, str):
        value = value.encode("ascii", "replace")
    if not isinstance(value, bytes) or len(value) != _Z85_LEN:
        size = len(value) if isinstance(value, bytes | str) else type(value).__name__
        raise KeyFileError(f"{where}: {name} must be a {_Z85_LEN}-byte Z85 CurveZMQ key, got {size}")
    try:
        raw = z85.decode(value)
    except Exception:
        raise KeyFileError(f"{where}: {name} is not valid Z85 text") from None
    if len(raw) != 32:
        raise KeyFileError(f"{where}: {name} decodes to {len(raw)} bytes, expected 32")
    return value


def _check_pairs(keys: KeySet, where: str) -> None:
    for role in ("server", "client"):
        public, secret = getattr(keys, f"{role}_public"), getattr(keys, f"{role}_secret")
        if zmq.curve_public(secret) != public:
            raise KeyFileError(f"{where}: {role}.secret does not match {role}.public (mixed key sets?)")


def write_keys(keys: KeySet, directory: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Write the four key files (mode 0600) into ``directory`` (created with mode 0700 if missing).

    Existing key files are a KeyFileError unless ``overwrite=True``: replacing the keys of a
    running job would lock its own workers out.
    """
    _require_curve()
    path = Path(directory)
    for f in fields(KeySet):
        _check_key(f.name, getattr(keys, f.name), "key set to write")
    _check_pairs(keys, "key set to write")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyFileError(f"cannot create key directory {str(path)!r}: {exc}") from None
    if not path.is_dir():
        raise KeyFileError(f"{str(path)!r} exists and is not a directory")
    existing = [name for name in KEY_FILES.values() if (path / name).exists()]
    if existing and not overwrite:
        raise KeyFileError(
            f"key directory {str(path)!r} already holds {existing}; refusing to overwrite them"
        )
    for attr, name in KEY_FILES.items():
        target = path / name
        tmp = path / f".{name}.tmp"
        try:
            if tmp.exists():
                tmp.unlink()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(getattr(keys, attr) + b"\n")
            os.chmod(tmp, 0o600)  # the umask may have removed bits, never added: make it exact
            os.replace(tmp, target)
        except OSError as exc:
            raise KeyFileError(f"cannot write key file {str(target)!r}: {exc}") from None


def read_keys(directory: str | os.PathLike) -> KeySet:
    """Read and check a key directory written by ``write_keys``; anything wrong is a KeyFileError."""
    path = Path(directory)
    if not path.is_dir():
        raise KeyFileError(
            f"key directory {str(path)!r} does not exist (create one with `psrv keys DIR`); "
            f"expected files: {sorted(KEY_FILES.values())}"
        )
    missing = [name for name in KEY_FILES.values() if not (path / name).is_file()]
    if missing:
        raise KeyFileError(f"key directory {str(path)!r} lacks {missing}")
    values: dict[str, bytes] = {}
    for attr, name in KEY_FILES.items():
        file = path / name
        try:
            data = file.read_bytes().strip()
            mode = stat.S_IMODE(file.stat().st_mode)
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {str(file)!r}: {exc}") from None
        if attr.endswith("secret") and mode & 0o077:
            log.warning("key file %s has mode %o: others can read it (expected 0600)", file, mode)
        values[attr] = _check_key(name, data, str(file))
    keys = KeySet(**values)
    _check_pairs(keys, f"key directory {str(path)!r}")
    return keys
