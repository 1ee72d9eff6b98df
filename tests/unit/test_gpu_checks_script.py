"""scripts/gpu_checks.sh, the one command a maintainer with a GPU runs, stays runnable: valid bash, and
every test file and test it names exists (a renamed test would otherwise drop out of the GPU run
silently, and CI never runs it)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_checks.sh"


def test_the_script_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_every_test_it_names_exists() -> None:
    named = re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", SCRIPT.read_text())
    assert len(named) >= 6, named
    for path, function in named:
        source = ROOT / path
        assert source.is_file(), f"{SCRIPT.name} names {path}, which does not exist"
        if function:
            tree = ast.parse(source.read_text())
            names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert function in names, f"{SCRIPT.name} names {path}::{function}, which does not exist"
    for script in re.findall(r"scripts/(\w+\.py)", SCRIPT.read_text()):
        assert (ROOT / "scripts" / script).is_file(), script
