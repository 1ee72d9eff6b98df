"""Where numba keeps compiled kernels: configurable, as Spark executors may not write next to the package.

numba reads ``NUMBA_CACHE_DIR`` when it is imported. psrv also honours its own variable,
``PSRV_NUMBA_CACHE_DIR``, which wins over ``NUMBA_CACHE_DIR`` and is copied onto it before numba is
imported (and onto numba's live config if numba was imported earlier, since the cache locator reads
it when each kernel is defined). Without either, numba caches next to the source files, or in the
user-wide cache directory when the package folder is read-only.
"""

from __future__ import annotations

import os
import sys

PSRV_CACHE_ENV = "PSRV_NUMBA_CACHE_DIR"
NUMBA_CACHE_ENV = "NUMBA_CACHE_DIR"


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
