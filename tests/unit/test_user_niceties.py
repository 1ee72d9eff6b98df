"""What a user notices first (issue 12): the version, type hints, --log-level after the subcommand,
a missing Java said in one line, files written with the user's umask."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest
from psrv.nn._files import current_umask, write_atomically
from psrv.server.cli import build_parser, main
from psrv.spark.java import java_problem


def test_version_from_the_cli_and_the_namespace(capsys) -> None:
    import psrv
    import psrv.server

    expected = metadata.version("psrv")
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"psrv {expected}"
    assert psrv.server.__version__ == expected
    assert psrv.__version__ == expected


@pytest.mark.parametrize("package", ["encoding", "transport", "server", "nn", "spark"])
def test_every_package_ships_py_typed(package) -> None:
    import importlib

    module = importlib.import_module(f"psrv.{package}")
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
