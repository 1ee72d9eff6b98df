"""What a user notices first: the version, type hints, --log-level after the subcommand,
a missing Java said in one line, files written with the user's umask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from psrv.nn._files import current_umask, write_atomically
from psrv.server.cli import build_parser, main
from psrv.spark.driver.java import java_problem


def test_version_from_the_cli_and_the_package(capsys) -> None:
    import psrv
    import psrv.server

    expected = metadata.version("psrv")
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"psrv {expected}"
    assert psrv.server.__version__ == expected
    assert psrv.__version__ == expected


def test_bare_import_psrv_has_the_version_and_stays_light(tmp_path) -> None:
    """``import psrv`` alone (a fresh interpreter, outside the source tree) gives ``__version__`` from the
    installed metadata, loads none of the subpackages (no numba, Spark or torch), and the subpackages
    still import beside it (the top-level package lives in top/, each subpackage in its own folder)."""
    code = ("import json, sys, psrv; loaded = sorted(m for m in sys.modules if m.startswith('psrv.') "
            "and m != 'psrv._version' "
            "or m.split('.')[0] in ('numba', 'pyspark', 'torch', 'zmq')); "
            "import psrv.encoding, psrv.transport, psrv.server, psrv.nn, psrv.spark; "
            "print(json.dumps([psrv.__version__, psrv.__file__, loaded, psrv.spark.__version__, "
            "callable(psrv.run)]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    version, location, loaded, spark_version, has_run = json.loads(done.stdout)
    assert has_run  # psrv.run is there, and importing psrv did not load psrv.torch for it
    assert version == metadata.version("psrv") == spark_version
    assert loaded == []
    assert Path(location).name == "__init__.py"


@pytest.mark.parametrize("package", ["", ".encoding", ".transport", ".server", ".nn", ".spark"])
def test_every_package_ships_py_typed(package) -> None:
    import importlib

    module = importlib.import_module(f"psrv{package}")
    assert (Path(module.__file__).parent / "py.typed").is_file()


def test_log_level_is_accepted_before_and_after_the_subcommand() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo", "--log-level", "DEBUG"]).log_level == "DEBUG"
    assert parser.parse_args(["--log-level", "WARNING", "demo"]).log_level == "WARNING"
    assert parser.parse_args(["demo"]).log_level == "INFO"


def test_missing_java_is_one_line_naming_java_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # a folder without bin/java
    problem = java_problem()
    assert problem is not None and "JAVA_HOME" in problem and "\n" not in problem
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = java_problem()
    assert problem is not None and problem.startswith("Java not found") and "JAVA_HOME" in problem
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert java_problem() is None


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_get_the_users_umask(tmp_path, mask) -> None:
    previous = os.umask(mask)
    try:
        assert current_umask() == mask
        path = tmp_path / "network.psrv"
        write_atomically(path, b"data")
    finally:
        os.umask(previous)
    assert path.read_bytes() == b"data"
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_demo_says_in_one_line_that_java_is_missing(tmp_path) -> None:
    """``psrv demo`` without Java (no JAVA_HOME, no java on PATH) stops with one line before Spark's trace."""
    psrv_command = Path(sys.executable).with_name("psrv")
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHONPATH")}
    env["PATH"] = str(tmp_path)  # no java here
    done = subprocess.run([str(psrv_command), "demo", "--epochs", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("psrv demo: Java not found") and "JAVA_HOME" in lines[0]
    assert "Traceback" not in done.stdout + done.stderr and "JAVA_GATEWAY" not in done.stderr
    assert not (tmp_path / "psrv-demo-network.psrv").exists()


def test_progress_goes_to_stderr_never_stdout(capsys) -> None:
    from psrv.spark.observe.progress import LiveProgress

    node = {"partition": 0, "epoch": 0, "steps": 3, "examples": 48, "loss": 0.5}
    progress = LiveProgress(lambda: ([node], {"updates_applied": 2}), log_every_s=0.0)
    progress.poll()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("psrv fit: ")


def test_the_demos_output_is_ignored_by_git() -> None:
    """What `psrv demo` writes by default (its network file) is listed in .gitignore."""
    parser = build_parser()
    demo = parser._subparsers._group_actions[0].choices["demo"]
    output = demo.get_default("output")
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert output in ignored
