"""Reading and writing whole files for psrv.nn (networks, data files), without knowing about URIs.

psrv.nn reads and writes local paths itself (atomically, with the user's umask). Any other URI
(``hdfs://``, ``s3a://`` ...) needs a storage layer, which sits above psrv.nn: importing
:mod:`psrv.spark` registers :mod:`psrv.spark.storage` here (:func:`use_storage`), and from then on
every path, local ones included, goes through it, so its options and counters see every file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import IO
from urllib.parse import urlparse

__all__ = [
    "TMP_PREFIX",
    "atomic_local_writer",
    "current_umask",
    "read_whole",
    "use_storage",
    "write_atomically",
]

TMP_PREFIX = ".psrv-"
_umask_lock = threading.Lock()
_storage: tuple[Callable[[str], bytes], Callable[[str, bytes], None]] | None = None


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


@contextlib.contextmanager
def atomic_local_writer(path: str) -> Iterator[IO[bytes]]:
    """A temporary file in ``path``'s directory (created when missing), renamed over ``path`` when the
    block ends without error, so a crash never leaves half a file; it gets the user's umask, not the
    temporary file's private mode. ``OSError`` propagates as it is (callers add their context)."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".tmp", dir=directory)
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp's file is private (0600): the user's umask
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def use_storage(read: Callable[[str], bytes], write: Callable[[str, bytes], None]) -> None:
    """Route every path psrv.nn reads or writes through a storage layer (psrv.spark.storage calls this
    when imported), so networks and data files may live at any URI that layer reaches."""
    global _storage
    _storage = (read, write)


def _local_path(path: str) -> str | None:
    """The local path ``path`` names (a plain path or a ``file:`` URI), or None for any other URI."""
    parsed = urlparse(path)
    scheme = parsed.scheme.lower()
    if len(scheme) <= 1:  # no scheme, or a Windows drive letter
        return path
    if scheme == "file" and parsed.netloc in ("", "localhost"):
        return parsed.path
    return None


def _no_storage(path: str) -> OSError:
    return OSError(
        f"{path!r} is not a local path, and no storage layer is loaded: import psrv.spark "
        "(its storage reads and writes hdfs://, s3a:// and other Hadoop-FS URIs)"
    )


def write_atomically(path: str | os.PathLike[str], data: bytes, *, make_parents: bool = False) -> None:
    """Write one whole file atomically (temporary file + rename where the file system renames
    atomically); missing parent directories are always created (``make_parents`` is kept for
    callers that ask for it explicitly)."""
    text = os.fspath(path)
    if _storage is not None:
        _storage[1](text, data)
        return
    local = _local_path(text)
    if local is None:
        raise _no_storage(text)
    with atomic_local_writer(local) as handle:
        handle.write(data)


def read_whole(path: str | os.PathLike[str]) -> bytes:
    """The bytes of one file (local path, or any URI the registered storage layer reaches); raises
    ``OSError`` when unreadable."""
    text = os.fspath(path)
    if _storage is not None:
        return _storage[0](text)
    local = _local_path(text)
    if local is None:
        raise _no_storage(text)
    with open(local, "rb") as handle:
        return handle.read()
