"""Runs under one checkpoint directory: each fit writes its checkpoints to ``checkpoint_dir/<run_id>``.

A fit never writes into another run's directory: without ``resume`` it takes a fresh run id (or refuses
a given one that already holds checkpoints), so two fits sharing a ``checkpoint_dir`` keep each other's
checkpoints. ``resume=True`` continues the run named by ``run_id``, or, without one, the run that wrote
the last checkpoint under ``checkpoint_dir`` (recorded in the ``latest-run`` file beside the runs, so the
choice needs no clock of the file system and no listing of an object store).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from psrv.spark import storage
from psrv.spark.errors import SparkConfigError, StorageError

log = logging.getLogger(__name__)

LATEST_RUN = "latest-run"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Run:
    """Where one fit's checkpoints go, and whether it continues an earlier fit of the same run."""

    run_id: str
    directory: str
    resumed: bool


def new_run_id() -> str:
    """A fresh run id that sorts by start time: ``20261125-201502-3fa2c1`` (UTC)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def check_run_id(run_id: object) -> str:
    """A run id is one directory name: letters, digits, ``.``, ``_`` and ``-``."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or run_id == LATEST_RUN:
        raise SparkConfigError(
            f"run_id: expected a directory name of letters, digits, '.', '_' and '-' (not {LATEST_RUN!r}), "
            f"got {run_id!r}")
    return run_id


def run_directory(checkpoint_dir: str, run_id: str) -> str:
    return checkpoint_dir.rstrip("/") + "/" + run_id


def _marker(checkpoint_dir: str) -> str:
    return checkpoint_dir.rstrip("/") + "/" + LATEST_RUN


def latest_run(checkpoint_dir: str) -> str | None:
    """The run that wrote the last checkpoint under ``checkpoint_dir`` (None when none did)."""
    marker = _marker(checkpoint_dir)
    try:
        if not storage.exists(marker):
            return None
        text = storage.read_bytes(marker).decode("utf-8", "replace").strip()
    except StorageError:
        return None
    return text if _RUN_ID.fullmatch(text) else None


def mark_latest(checkpoint_dir: str, run_id: str) -> None:
    """Record ``run_id`` as the run that wrote the last checkpoint (after each checkpoint)."""
    storage.write_bytes(_marker(checkpoint_dir), run_id.encode("utf-8") + b"\n")


def choose_run(checkpoint_dir: str, run_id: str | None, resume: bool,
               has_checkpoint: Callable[[str], str | None]) -> Run:
    """The run a fit writes to (see the module doc); ``has_checkpoint(directory)`` -> the newest
    checkpoint's path there, or None."""
    if run_id is not None:
        run_id = check_run_id(run_id)
        directory = run_directory(checkpoint_dir, run_id)
        found = has_checkpoint(directory)
        if found is not None and not resume:
            raise SparkConfigError(
                f"checkpoint_dir {checkpoint_dir!r} already holds run {run_id!r} ({found}): a new fit does "
                "not overwrite it; pass resume=True to continue that run, or another run_id (none: a fresh "
                "one)")
        if found is None and resume:
            log.info("resume=True: run %r has no checkpoint under %s yet: it starts at epoch 1", run_id,
                     checkpoint_dir)
        return Run(run_id, directory, resumed=resume and found is not None)
    if resume:
        latest = latest_run(checkpoint_dir)
        if latest is not None and has_checkpoint(run_directory(checkpoint_dir, latest)) is not None:
            log.info("resume=True without run_id: resuming run %r, the run that wrote the last checkpoint "
                     "under %s (pass run_id=... to choose another)", latest, checkpoint_dir)
            return Run(latest, run_directory(checkpoint_dir, latest), resumed=True)
        fresh = new_run_id()
        log.info("resume=True: no earlier run under %s; starting run %r at epoch 1", checkpoint_dir, fresh)
        return Run(fresh, run_directory(checkpoint_dir, fresh), resumed=False)
    fresh = new_run_id()
    return Run(fresh, run_directory(checkpoint_dir, fresh), resumed=False)


__all__ = ["LATEST_RUN", "Run", "check_run_id", "choose_run", "latest_run", "mark_latest", "new_run_id",
           "run_directory"]
