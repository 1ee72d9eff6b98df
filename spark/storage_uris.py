"""Paths and URIs as psrv's storage layer names them: schemes, local paths, joins (never ``os.path``
for URIs: they use ``/`` on every platform)."""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlparse

__all__ = [
    "OBJECT_STORE_SCHEMES",
    "absolute",
    "basename",
    "is_local",
    "is_visible",
    "join",
    "local_path",
    "parent",
    "scheme_of",
]

# an object on these stores appears whole when its upload ends, and a rename is a copy
OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "gcs"})


def scheme_of(uri: str) -> str:
    """The lower-case scheme of ``uri``; "" for a plain path."""
    scheme = urlparse(os.fspath(uri)).scheme.lower()
    return "" if len(scheme) == 1 else scheme  # "C:" on Windows is a drive, not a scheme


def is_local(uri: str | os.PathLike[str]) -> bool:
    """A plain path or a ``file:`` URI."""
    return scheme_of(os.fspath(uri)) in ("", "file")


def local_path(uri: str | os.PathLike[str]) -> str:
    """The local path a plain path or ``file:`` URI names (``file:///a``, ``file:/a`` -> ``/a``)."""
    text = os.fspath(uri)
    if scheme_of(text) == "file":
        parsed = urlparse(text)
        return parsed.path if not parsed.netloc or parsed.netloc == "localhost" else text
    return text


def absolute(uri: str | os.PathLike[str]) -> str:
    """Executors run in other working directories: a relative local path becomes absolute
    (``file:`` URIs stay URIs, ``file:///abs``); other URIs are returned as they are."""
    text = os.fspath(uri)
    if scheme_of(text) == "file":
        return "file://" + os.path.abspath(local_path(text))
    if scheme_of(text) == "":
        return os.path.abspath(text)
    return text


def join(base: str, *names: str) -> str:
    """``base/name/...`` for a path or URI (never ``os.path.join``: URIs use ``/``)."""
    out = os.fspath(base)
    for name in names:
        out = out.rstrip("/") + "/" + name.lstrip("/")
    return out


def parent(uri: str) -> str:
    """The directory holding ``uri`` (``/`` at the root)."""
    text = os.fspath(uri).rstrip("/")
    head, _, _ = text.rpartition("/")
    return head or "/"


def is_visible(name: str) -> bool:
    """Whether listings show ``name`` (hidden and ``_``-prefixed names such as _SUCCESS are skipped)."""
    return not name.startswith((".", "_"))


def basename(uri: str) -> str:
    """The last name in a path or URI (a trailing ``/`` ignored)."""
    return posixpath.basename(os.fspath(uri).rstrip("/"))
