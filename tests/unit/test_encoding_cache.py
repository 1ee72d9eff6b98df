"""The numba kernel cache: its place is configurable (PSRV_NUMBA_CACHE_DIR wins), and a warm cache is used.

Runs real fresh Python processes, as a Spark executor would start.
"""

from __future__ import annotations

import json
import os
import shutil
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


USER_KERNEL = """
import numba


@numba.njit(cache=True)
def triple(x):
    return 3 * x
"""

# PROBE, also calling a user's own cached function and naming the psrv it imported
COPY_PROBE = (PROBE.replace("import numba\n",
                           "import numba, user_kernel\nassert user_kernel.triple(2) == 6\n")
              .replace('"seconds"', '"file": psrv.encoding.__file__, "seconds"'))


def _copy_of_psrv_encoding(root: Path) -> Path:
    """psrv's top package and psrv.encoding copied under ``root``, as an unpacked archive holds them."""
    import psrv
    import psrv.encoding

    package = root / "psrv"
    shutil.copytree(Path(psrv.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(psrv.encoding.__file__).parent, package / "encoding",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "user_kernel.py").write_text(USER_KERNEL)
    return package


def _probe_copy(root: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PSRV_NUMBA_CACHE_DIR")}
    env.update(PSRV_NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", COPY_PROBE], env=env, capture_output=True, text=True,
                          timeout=150, cwd=root)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_two_copies_of_the_package_at_different_paths_share_one_compile(tmp_path: Path) -> None:
    """An archive unpacked per executor puts psrv at a new path each time: the second copy compiles
    nothing, its kernels filed under a hash of the source's content; a user's own cached numba function
    keeps numba's path-keyed folder."""
    from psrv.encoding._numba_cache import content_subpath

    cache = tmp_path / "cache"
    first, second = tmp_path / "executor-1", tmp_path / "executor-2"
    package = _copy_of_psrv_encoding(first)
    _copy_of_psrv_encoding(second)

    cold = _probe_copy(first, cache)
    assert Path(cold["file"]).is_relative_to(first), cold  # the copy, not the installed psrv
    assert cold["misses"] > 0 and cold["hits"] == 0, cold
    warm = _probe_copy(second, cache)
    assert Path(warm["file"]).is_relative_to(second), warm
    assert warm["misses"] == 0 and warm["hits"] == cold["misses"], warm

    folders = sorted(p.name for p in cache.iterdir())
    ours = content_subpath(str(package / "encoding" / "_kernels.py"))
    assert ours in folders, folders
    # the user's function: one folder per copy, named by numba's path hash as before
    theirs = [f for f in folders if f != ours]
    assert len(theirs) == 2 and all(not f.startswith("psrv-") for f in theirs), folders


def test_the_cache_folder_follows_the_source_content_not_its_path(tmp_path: Path) -> None:
    from psrv.encoding._numba_cache import content_subpath

    a, b, c = tmp_path / "a" / "encoding", tmp_path / "b" / "encoding", tmp_path / "c" / "encoding"
    for folder, text in ((a, "x = 1\n"), (b, "x = 1\n"), (c, "x = 2\n")):
        folder.mkdir(parents=True)
        (folder / "_kernels.py").write_text(text)
    same = content_subpath(str(a / "_kernels.py"))
    assert same == content_subpath(str(b / "_kernels.py"))
    assert same.startswith("psrv-encoding_")
    assert content_subpath(str(c / "_kernels.py")) != same
