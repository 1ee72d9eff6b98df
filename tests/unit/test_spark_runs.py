"""Runs under one checkpoint directory: which run a fit writes to, and which one ``resume`` continues."""

from __future__ import annotations

import logging

import pytest
from psrv.spark.driver import runs
from psrv.spark.driver.checkpoints import newest
from psrv.spark.errors import SparkConfigError


def _has(directory: str) -> str | None:
    return newest(None, directory)


def _write_checkpoint(root, run_id: str, epoch: int) -> None:
    (root / run_id).mkdir(parents=True, exist_ok=True)
    (root / run_id / f"checkpoint-{epoch:06d}.psrvckpt").write_bytes(b"x")
    runs.mark_latest(str(root), run_id)


def test_a_new_fit_takes_a_fresh_run_and_never_an_existing_one(tmp_path) -> None:
    root = str(tmp_path)
    first = runs.choose_run(root, None, False, _has)
    second = runs.choose_run(root, None, False, _has)
    assert first.run_id != second.run_id and not first.resumed
    assert first.directory == f"{root}/{first.run_id}"
    _write_checkpoint(tmp_path, "mine", 2)
    with pytest.raises(SparkConfigError, match="already holds run 'mine'.*resume=True"):
        runs.choose_run(root, "mine", False, _has)
    assert runs.choose_run(root, "other", False, _has) == runs.Run("other", f"{root}/other", False)


def test_resume_continues_the_named_run_or_the_one_that_wrote_last(tmp_path, caplog) -> None:
    root = str(tmp_path)
    assert not runs.choose_run(root, None, True, _has).resumed  # nothing to resume: a fresh run
    _write_checkpoint(tmp_path, "a", 3)
    _write_checkpoint(tmp_path, "b", 1)  # b wrote last
    with caplog.at_level(logging.INFO, logger="psrv.spark.driver.runs"):
        chosen = runs.choose_run(root, None, True, _has)
    assert chosen == runs.Run("b", f"{root}/b", True)
    assert "resuming run 'b'" in caplog.text
    assert runs.choose_run(root, "a", True, _has) == runs.Run("a", f"{root}/a", True)
    assert not runs.choose_run(root, "new", True, _has).resumed


@pytest.mark.parametrize("bad", ["", "../up", "a/b", runs.LATEST_RUN, 7, ".hidden"])
def test_a_run_id_is_one_plain_directory_name(bad) -> None:
    with pytest.raises(SparkConfigError, match="run_id: expected a directory name"):
        runs.check_run_id(bad)
