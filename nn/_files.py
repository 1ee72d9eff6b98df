"""Writing a file atomically: the one way psrv writes data, network and report files."""

from __future__ import annotations

import os
import tempfile
import threading

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
    """Write via a temp file + rename, so a crash never leaves half a file under ``path``.

    ``make_parents`` creates missing parent directories first.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if make_parents:
        os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".psrv-", suffix=".tmp", dir=directory)
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp's file is private (0600): give the user's umask
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
