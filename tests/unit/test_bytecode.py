"""The test run's one compile of the project's modules (tests/bytecode.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.bytecode import COMPILED_FOLDERS, compile_project_modules


def test_every_package_folder_of_pyproject_is_compiled() -> None:
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    # compile_dir recurses, so a subpackage's folder ("server/cli") is covered by its top folder
    folders = {folder.split("/")[0] for folder in project["tool"]["setuptools"]["package-dir"].values()}
    assert folders and folders <= set(COMPILED_FOLDERS), folders - set(COMPILED_FOLDERS)


def test_the_compiled_modules_are_what_a_process_that_writes_no_bytecode_imports(tmp_path) -> None:
    package = tmp_path / "nn"
    package.mkdir()
    source = package / "thing.py"
    source.write_text("VALUE = 41 + 1\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bad.py").write_text("def (:\n")

    assert compile_project_modules(tmp_path, ("nn",))
    assert not compile_project_modules(tmp_path, ("nn", "broken", "absent"))  # a syntax error: reported
    assert Path(importlib.util.cache_from_source(str(source))).is_file()
    # the source changed to the same size and time stamp: only a process reading the compiled file sees 42
    stamp = source.stat()
    source.write_text("VALUE = 41 + 2\n")
    os.utime(source, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    probe = "import thing; print(thing.VALUE)"
    done = subprocess.run([sys.executable, "-B", "-c", probe], cwd=package, capture_output=True, text=True,
                          timeout=60, check=True)  # -B: writes no byte-code, as under PYTHONDONTWRITEBYTECODE
    assert done.stdout.split() == ["42"]
