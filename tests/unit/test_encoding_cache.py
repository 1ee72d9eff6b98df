"""The numba kernel cache: its place is configurable (PSRV_NUMBA_CACHE_DIR wins), and a warm cache is used.

Runs real fresh Python processes, as a Spark executor would start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, time
start = time.perf_counter()
import numpy as np
import psrv.encoding
from psrv.encoding import _kernels, decode, encode
assert not any(k.loaded for k in _kernels.ALL_KERNELS), "kernels load on first use, not at import"
x = np.zeros(100, dtype=np.float32); x[7] = 2.0
message = encode(x, 1.0)
target = np.zeros(100, dtype=np.float32); decode(message, target)
assert target[7] == 1.0
import numba
print(json.dumps({
    "seconds": time.perf_counter() - start,
    "cache_dir": numba.config.CACHE_DIR,
    "loaded": sum(k.loaded for k in _kernels.ALL_KERNELS),
    "hits": sum(sum(k.dispatcher.stats.cache_hits.values()) for k in _kernels.ALL_KERNELS if k.loaded),
    "misses": sum(sum(k.dispatcher.stats.cache_misses.values()) for k in _kernels.ALL_KERNELS if k.loaded),
}))
"""


def run_probe(env_overrides: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PSRV_NUMBA_CACHE_DIR")}
    env.update(env_overrides)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_cache_dir_is_configurable_and_a_warm_cache_skips_compilation(tmp_path: Path) -> None:
    ours = tmp_path / "psrv-cache"
    numba_own = tmp_path / "numba-cache"
    cold = run_probe({"PSRV_NUMBA_CACHE_DIR": str(ours), "NUMBA_CACHE_DIR": str(numba_own)})
    assert cold["cache_dir"] == str(ours)
    assert cold["misses"] > 0
    assert list(ours.rglob("*.nbi")), "no numba index files were written to PSRV_NUMBA_CACHE_DIR"
    assert not numba_own.exists(), "PSRV_NUMBA_CACHE_DIR must win over NUMBA_CACHE_DIR"
    # numba's own variable alone points at the same, now warm, cache: nothing is compiled again
    warm = run_probe({"NUMBA_CACHE_DIR": str(ours)})
    assert warm["cache_dir"] == str(ours)
    assert warm["misses"] == 0
    assert warm["hits"] > 0
