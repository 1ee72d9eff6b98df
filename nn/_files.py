"""Writing a file atomically: the one way psrv writes data, network and report files."""

from __future__ import annotations

import os
import tempfile


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
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
