"""Where numba keeps compiled kernels: configurable, and shared by every copy of the same psrv source.

numba reads ``NUMBA_CACHE_DIR`` when it is imported. psrv also honours its own variable,
``PSRV_NUMBA_CACHE_DIR``, which wins over ``NUMBA_CACHE_DIR`` and is copied onto it before numba is
imported (and onto numba's live config if numba was imported earlier, since the cache locator reads
it when each kernel is defined). Without either, numba caches next to the source files, or in the
user-wide cache directory when the package folder is read-only.

In a configured cache directory numba files each source folder's kernels under a hash of the folder's
*path*. A packed environment shipped with ``--archives`` is unpacked into a new folder for every
executor of every application, so each would compile the kernels again (seconds per executor) into a
cache nobody reads twice. psrv's kernels are therefore filed under a hash of their source file's
*content* instead (``ContentKeyedCacheLocator``): every copy of the same psrv on a machine shares one
compile. numba still checks each entry against the source it was built from, and the index names the
Python version and the CPU, so nothing stale or foreign is loaded. Other numba functions of the process
are untouched (the locator declines any file outside this package), and ``NUMBA_CACHE_LOCATOR_CLASSES``,
where set, still wins.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from pathlib import Path

PSRV_CACHE_ENV = "PSRV_NUMBA_CACHE_DIR"
NUMBA_CACHE_ENV = "NUMBA_CACHE_DIR"
#: the folder whose source files get content-keyed cache entries (this package)
PACKAGE_DIR = Path(__file__).resolve().parent
#: the prefix of the cache folders the locator makes (the rest: the source folder's name and a content hash)
SUBPATH_PREFIX = "psrv"

_log = logging.getLogger(__name__)


def apply_cache_dir_from_env() -> str | None:
    """Map PSRV_NUMBA_CACHE_DIR onto numba's setting; return the directory in effect (None: default)."""
    path = os.environ.get(PSRV_CACHE_ENV)
    if path:
        os.environ[NUMBA_CACHE_ENV] = path
        numba_config = sys.modules.get("numba.core.config")
        if numba_config is not None:
            numba_config.CACHE_DIR = path
        return path
    return os.environ.get(NUMBA_CACHE_ENV) or None


def content_subpath(py_file: str) -> str:
    """The cache folder of ``py_file``'s kernels: its folder's name and a hash of its bytes, not its path."""
    path = Path(py_file).resolve()
    stat = path.stat()
    return f"{SUBPATH_PREFIX}-{path.parent.name}_{_digest(path, stat.st_mtime_ns, stat.st_size)}"


@functools.cache
def _digest(path: Path, mtime_ns: int, size: int) -> str:
    """The file's SHA-1, read once per version of the file (every kernel of a module asks for it)."""
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _in_package(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(PACKAGE_DIR)
    except OSError:
        return False


def install_content_keyed_locator() -> bool:
    """Put ``ContentKeyedCacheLocator`` first in numba's locators for compiled functions; True once it is.

    Uses numba's caching internals; where they differ (another numba version), psrv keeps numba's own
    path-keyed locators and says so in the debug log, which costs a compile per unpacked copy, not
    correctness.
    """
    try:
        from numba.core import caching

        base = getattr(caching, "UserProvidedCacheLocator", None) or caching._UserProvidedCacheLocator
        impl = caching.CompileResultCacheImpl
        current = list(impl._locator_classes)
    except (ImportError, AttributeError) as exc:  # pragma: no cover - depends on the numba version
        _log.debug("numba's cache locators not found (%s): kernels are cached by path", exc)
        return False
    if any(getattr(cls, "psrv_content_keyed", False) for cls in current):
        return True

    class ContentKeyedCacheLocator(base):
        """numba's locator for a configured cache directory, keyed by this package's source content."""

        psrv_content_keyed = True

        @classmethod
        def get_suitable_cache_subpath(cls, py_file):
            return content_subpath(py_file)

        @classmethod
        def from_function(cls, py_func, py_file):
            if not _in_package(py_file):
                return None
            return super().from_function(py_func, py_file)

    impl._locator_classes = [ContentKeyedCacheLocator, *current]
    return True
