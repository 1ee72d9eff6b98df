"""The "export" training approach: write the RDD's data as minibatch files, then train from paths.

Exporting once decouples training from the RDD's lineage (no recomputation per round, a retried
task re-reads its files) and lets every worker fetch exactly the minibatches it is given. On a
multi-host cluster ``export_directory`` must be on a file system every executor sees (a shared
mount); the default, a temporary directory, is right for ``local[N]`` and ``local-cluster``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from psrv.spark.batching import check_batch_size, rebatch
from psrv.spark.errors import ExportError, SparkConfigError

if TYPE_CHECKING:
    from pyspark import RDD

FILE_SUFFIX = ".psrvds"
TRAINING_APPROACHES = ("export", "direct")


def check_training_approach(approach: object) -> str:
    if approach not in TRAINING_APPROACHES:
        raise SparkConfigError(
            f"rdd_training_approach: expected one of {TRAINING_APPROACHES}, got {approach!r}"
        )
    return str(approach)


def new_export_directory(export_directory: str | None) -> str:
    """A fresh directory for one export, under ``export_directory`` (or the system temp dir)."""
    base = export_directory or os.path.join(tempfile.gettempdir(), "psrv-export")
    if base.startswith("file:"):
        base = base[len("file:"):]
        while base.startswith("//"):
            base = base[1:]
    path = os.path.join(base, f"export-{uuid.uuid4().hex[:12]}")
    try:
        os.makedirs(path, exist_ok=False)
    except OSError as exc:
        raise ExportError(f"cannot create export directory {path!r}: {exc}") from exc
    return path


def _export_partition(directory: str, batch_size: int):
    def export(index: int, items: Iterable[object]) -> Iterator[str]:
        os.makedirs(directory, exist_ok=True)
        for number, batch in enumerate(rebatch(items, batch_size)):
            path = os.path.join(directory, f"part-{index:05d}-{number:07d}{FILE_SUFFIX}")
            try:
                batch.save(path)
            except OSError as exc:
                raise ExportError(f"cannot write minibatch file {path!r}: {exc}") from exc
            yield path

    return export


def export_minibatches(rdd: RDD, batch_size: int, directory: str) -> list[str]:
    """Write every partition of ``rdd`` as minibatch files of ``batch_size`` examples; return the paths.

    The paths come back sorted (partition, then position), so an export is deterministic.
    """
    check_batch_size(batch_size)
    paths = rdd.mapPartitionsWithIndex(_export_partition(directory, batch_size)).collect()
    return sorted(paths)


def remove_export(directory: str) -> None:
    """Delete one export's directory (best effort: a missing directory is fine)."""
    shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def exported_minibatches(rdd: RDD, batch_size: int, export_directory: str | None) -> Iterator[list[str]]:
    """The paths of ``rdd`` exported as minibatch files under a fresh directory, removed on exit."""
    directory = new_export_directory(export_directory)
    try:
        yield export_minibatches(rdd, batch_size, directory)
    finally:
        remove_export(directory)
