"""Reading and writing whole files: the one way psrv reads and writes data, network and report files.

Every path may be a local path or any URI the storage layer reaches (``file://``, ``hdfs://``,
``s3a://`` ...): both functions go through :mod:`psrv.spark.storage` (imported when first used, so
that importing psrv.nn stays light).
"""

from __future__ import annotations

import os
from typing import IO


def write_atomically(path: str | os.PathLike[str], data: bytes, *, make_parents: bool = False) -> None:
    """Write via a temporary file + rename (where the file system renames atomically), so a crash
    never leaves half a file under ``path``. Missing parent directories are always created
    (``make_parents`` is kept for callers that ask for it explicitly)."""
    from psrv.spark import storage

    storage.write_bytes(path, data)


def read_whole(path: str | os.PathLike[str]) -> bytes:
    """The bytes of one file (local path or URI); raises ``OSError`` (``StorageError``) when unreadable."""
    from psrv.spark import storage

    return storage.read_bytes(path)


def open_readable(path: str | os.PathLike[str]) -> IO[bytes]:
    """A readable binary stream of a local path or URI (close it)."""
    from psrv.spark import storage

    return storage.open_input(path)
