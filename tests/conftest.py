"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import tempfile

# Compiled numba kernels are cached per test run in a writable place, as on a Spark executor.
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "psrv-numba-cache"))
