"""Byte-code of the project's own modules, compiled once per test run before the xdist workers start.

The suite starts several hundred Python processes (xdist workers, mesh nodes, Spark's Python workers,
CLI runs), and each imports about 180 of psrv's modules. Where PYTHONDONTWRITEBYTECODE is set (as on
this project's machines) no process keeps what it compiled, so each compiled them again: 0.6 s of CPU
per process, a sixth of a process-heavy test's time (tests/integration/test_transport_cli.py with
test_transport_cluster.py: 49 s against 42 s). The run's first process compiles the folders into their
git-ignored ``__pycache__`` folders (1.4 s); every later import reads them, and Python still checks each
against its source's time stamp. A file that cannot be written is skipped: its imports compile as
before.

(Filling numba's kernel cache the same way, in a background process, was measured and not kept: with
an empty cache it costs 23 s of CPU, and a test whose processes compile their own kernels paid 9 s.)
"""

from __future__ import annotations

import compileall
import tomllib
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: what the tests import from the tree beside psrv's own package folders
TREE_FOLDERS = ("tests", "scripts", "examples")


def package_folders(root: Path = PROJECT_ROOT) -> tuple[str, ...]:
    """psrv's top package folders, as pyproject.toml's package-dir names them (compile_dir recurses, so
    "server" covers "server/cli")."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    folders = (folder.split("/")[0] for folder in project["tool"]["setuptools"]["package-dir"].values())
    return tuple(dict.fromkeys(folders))


#: psrv's package folders and what the tests import from the tree
COMPILED_FOLDERS = (*package_folders(), *TREE_FOLDERS)


def compile_project_modules(root: Path = PROJECT_ROOT, folders: tuple[str, ...] = COMPILED_FOLDERS) -> bool:
    """Compile every module under ``root``'s ``folders``; False where some could not be compiled."""
    compiled = True
    for folder in folders:
        if (root / folder).is_dir():  # quiet=2: a file that cannot be compiled or written is not printed
            compiled &= bool(compileall.compile_dir(root / folder, quiet=2, workers=1))
    return compiled
