"""Reading and writing whole files: the one way psrv reads and writes data, network and report files.

Every path may be a local path or any URI the storage layer reaches (``file://``, ``hdfs://``,
``s3a://`` ...): both functions go through :mod:`psrv.spark.storage` (imported when first used, so
that importing psrv.nn stays light).
"""

from __future__ import annotations

import os
import threading
from typing import IO

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask (read from /proc where it can be, without changing it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:  # elsewhere the only way to read it is to set it, briefly
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def write_atomically(path: str | os.PathLike[str], data: bytes, *, make_parents: bool = False) -> None:
    """Write via a temporary file + rename (where the file system renames atomically), so a crash
    never leaves half a file under ``path``. Missing parent directories are always created
    (``make_parents`` is kept for callers that ask for it explicitly). A local file gets the user's
    umask (``current_umask``), not the temporary file's private mode; only key files are private."""
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
