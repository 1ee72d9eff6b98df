"""The "export" training approach: write the RDD's data as minibatch files, then train from paths.

Exporting once decouples training from the RDD's lineage (no recomputation per round, a retried
task re-reads its files) and lets every worker fetch exactly the minibatches it is given. The
executors write and read the files themselves through :mod:`psrv.spark.storage`, so
``export_directory`` may be any URI the cluster reaches (``hdfs://``, ``s3a://``, a shared
``file://`` mount ...).

Where an export goes when ``export_directory`` is not given: under ``/tmp/psrv-export`` on the
cluster's default file system (``fs.defaultFS``) when that is not ``file://``; on a ``file://``-only
cluster, the driver's temporary directory, but only when every executor is on the driver's host
(checked from the executors' addresses): on several hosts the export approach is refused with an
error naming ``export_directory`` and ``rdd_training_approach="direct"``.

An export is reused (:class:`ExportCache`): fitting the same RDD or DataFrame again with the same
batch size and partitioning trains from the files already written. Exports psrv placed in its
default location are removed by ``delete_temp_files()`` (``SparkNetwork.close()``); files under a
user-given ``export_directory`` are never deleted.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from psrv.nn.data import DATA_FILE_SUFFIX
from psrv.spark import storage
from psrv.spark.data.batching import check_batch_size, rebatch
from psrv.spark.errors import ExportError, ExportUnreachableError, SparkConfigError, StorageError

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

log = logging.getLogger(__name__)
DEFAULT_FS_EXPORT_ROOT = "/tmp/psrv-export"
MAX_CACHED_EXPORTS = 8

FILE_SUFFIX = DATA_FILE_SUFFIX
TRAINING_APPROACHES = ("export", "direct")


def check_training_approach(approach: object) -> str:
    if approach not in TRAINING_APPROACHES:
        raise SparkConfigError(
            f"rdd_training_approach: expected one of {TRAINING_APPROACHES}, got {approach!r}"
        )
    return str(approach)


def new_export_directory(export_directory: str | None) -> str:
    """A fresh directory for one export, under ``export_directory`` (or the system temp dir)."""
    import tempfile

    base = storage.absolute(export_directory or storage.join(tempfile.gettempdir(), "psrv-export"))
    path = storage.join(base, f"export-{uuid.uuid4().hex[:12]}")
    try:
        storage.makedirs(path)
    except StorageError as exc:
        raise ExportError(f"cannot create export directory {path!r}: {exc}") from exc
    return path


def _export_partition(directory: str, batch_size: int, options: dict[str, Any]):
    def export(index: int, items: Iterable[object]) -> Iterator[str]:
        storage.configure(options)
        for number, batch in enumerate(rebatch(items, batch_size)):
            path = storage.join(directory, f"part-{index:05d}-{number:07d}{FILE_SUFFIX}")
            try:
                storage.write_bytes(path, batch.to_bytes())
            except StorageError as exc:
                raise ExportError(f"cannot write minibatch file {path!r}: {exc}") from exc
            yield path

    return export


def export_minibatches(rdd: RDD, batch_size: int, directory: str) -> list[str]:
    """Write every partition of ``rdd`` as minibatch files of ``batch_size`` examples; return the paths.

    The paths come back sorted (partition, then position), so an export is deterministic.
    """
    check_batch_size(batch_size)
    storage.check_task_access(directory, "export_directory")
    options = storage.use_hadoop_configuration(rdd.context)
    paths = rdd.mapPartitionsWithIndex(_export_partition(directory, batch_size, options)).collect()
    return sorted(paths)


def remove_export(directory: str) -> None:
    """Delete one export's directory (best effort: a missing directory is fine)."""
    with suppress(StorageError, OSError):
        storage.delete(directory, recursive=True)


@contextmanager
def exported_minibatches(rdd: RDD, batch_size: int, export_directory: str | None) -> Iterator[list[str]]:
    """The paths of ``rdd`` exported as minibatch files under a fresh directory, removed on exit: under
    ``export_directory``, or psrv's default location (the cluster's default file system; refused on a
    multi-host cluster that has only file://), as for a single fit."""
    base = export_directory if export_directory is not None else default_export_base(rdd.context)
    directory = new_export_directory(base)
    try:
        yield export_minibatches(rdd, batch_size, directory)
    finally:
        remove_export(directory)


# --------------------------------------------------------------------------------------------------
# where the default export goes
# --------------------------------------------------------------------------------------------------
def _driver_machine_addresses(spark_context: SparkContext) -> set[str]:
    """Addresses that mean "the driver's machine": its own Spark address and every non-loopback
    address of its interfaces (other loopback addresses, such as 127.0.0.2, stay distinct hosts)."""
    import ipaddress

    addresses = set()
    driver = spark_context.getConf().get("spark.driver.host")
    if driver:
        addresses.add(_resolve(driver))
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                text = str(entry.address).split("%")[0]
                try:
                    if not ipaddress.ip_address(text).is_loopback:
                        addresses.add(text)
                except ValueError:
                    continue
    except Exception as exc:  # noqa: BLE001 - no interface list: the driver's own address only
        log.debug("cannot list this machine's addresses: %s", exc)
    return addresses


def _resolve(name: str) -> str:
    import socket

    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def executor_hosts(spark_context: SparkContext) -> set[str]:
    """The distinct hosts of the driver and the registered executors, from their addresses; every
    address of the driver's machine counts as one host, ``"driver"``."""
    names = set()
    try:
        for info in spark_context._jsc.sc().statusTracker().getExecutorInfos():  # the driver included
            names.add(str(info.host()))
    except Exception as exc:  # noqa: BLE001 - no JVM tracker: only the driver is known
        log.debug("cannot list the executors' hosts: %s", exc)
    local = _driver_machine_addresses(spark_context)
    hosts = {"driver"}
    for name in names:
        address = _resolve(name)
        hosts.add("driver" if address in local else address)
    return hosts


def default_fs(spark_context: SparkContext) -> str:
    try:
        return str(spark_context._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///")
    except Exception:  # noqa: BLE001 - a context without a JVM: the local file system
        return "file:///"


def default_export_base(spark_context: SparkContext, *, hosts: set[str] | None = None,
                        default_filesystem: str | None = None) -> str:
    """Where exports go when ``export_directory`` is not given (see the module docstring)."""
    import tempfile

    fs = default_filesystem if default_filesystem is not None else default_fs(spark_context)
    hosts = executor_hosts(spark_context) if hosts is None else hosts
    if not storage.is_local(fs):
        from urllib.parse import urlparse

        storage.use_hadoop_configuration(spark_context)  # the driver creates the folder: S3A settings

        parsed = urlparse(fs)
        base = f"{parsed.scheme}://{parsed.netloc}{DEFAULT_FS_EXPORT_ROOT}"
        if storage.reachable_in_tasks(base):
            return base
        if len(hosts) <= 1:
            return storage.join(tempfile.gettempdir(), "psrv-export")
        raise ExportUnreachableError(
            f"the export approach writes minibatch files that every executor must read; the cluster's "
            f"default file system {fs!r} needs fsspec on the driver and executors (pip install "
            f"'psrv[storage]'). Install it, set export_directory to a URI every executor reaches, or "
            f'use rdd_training_approach="direct"'
        )
    if len(hosts) > 1:
        raise ExportUnreachableError(
            f"the export approach needs a directory every executor can read, but this cluster's only "
            f"file system is file:// and its driver and executors run on {len(hosts)} hosts "
            f"({', '.join(sorted(hosts))}): "
            "the driver's temporary directory is not shared. Set export_directory to a shared "
            "location (a file:// path mounted on every host, or an hdfs://, s3a:// ... URI), or use "
            'rdd_training_approach="direct" (trains from the RDD in memory, no files)'
        )
    return storage.join(tempfile.gettempdir(), "psrv-export")


# --------------------------------------------------------------------------------------------------
# reuse
# --------------------------------------------------------------------------------------------------
def files_backed(rdd: RDD) -> bool:
    """Data that already sits in files every task reads itself (a Parquet scan): nothing to export."""
    return getattr(rdd, "_psrv_parquet_files", None) is not None


def source_key(rdd: RDD) -> tuple[Any, ...]:
    """What identifies the data a user fitted: a DataFrame's semantic plan hash (set by
    psrv.spark.data.inputs on the RDD it converts to) or the RDD itself (application id + RDD id)."""
    marked = getattr(rdd, "_psrv_source_key", None)
    if marked is not None:
        return tuple(marked)
    return ("rdd", str(rdd.context.applicationId), int(rdd.id()))


class _Export:
    __slots__ = ("directory", "paths", "temporary")

    def __init__(self, directory: str, paths: list[str], temporary: bool) -> None:
        self.directory = directory
        self.paths = paths
        self.temporary = temporary


class ExportCache:
    """The exports one training master wrote, by (data, batch size, partitioning, location).

    ``exports_written`` / ``files_written`` count what was actually written (the second fit of
    the same data adds nothing); ``reused`` counts fits served from files already there.
    """

    def __init__(self, max_exports: int = MAX_CACHED_EXPORTS) -> None:
        self.max_exports = max_exports
        self._exports: OrderedDict[tuple[Any, ...], _Export] = OrderedDict()
        self._lock = threading.Lock()
        self.exports_written = 0
        self.files_written = 0
        self.reused = 0

    def __getstate__(self) -> dict[str, Any]:  # a master may be pickled (closures): no lock, no entries
        return {"max_exports": self.max_exports, "exports_written": self.exports_written,
                "files_written": self.files_written, "reused": self.reused}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_exports"])  # type: ignore[misc]
        self.exports_written, self.files_written = state["exports_written"], state["files_written"]
        self.reused = state["reused"]

    def minibatch_paths(self, source: RDD, data: RDD, batch_size: int, export_directory: str | None,
                        partitioning: Any = None) -> list[str]:
        """The minibatch files of ``data`` (``source`` re-partitioned), exported now or reused."""
        key = (source_key(source), int(batch_size), int(data.getNumPartitions()), repr(partitioning),
               export_directory)
        with self._lock:
            found = self._exports.get(key)
        if found is not None and found.paths and storage.exists(found.paths[0]) \
                and storage.exists(found.paths[-1]):
            with self._lock:
                self._exports.move_to_end(key)
                self.reused += 1
            log.info("export reused: %d minibatch files under %s", len(found.paths), found.directory)
            return list(found.paths)
        if export_directory is None:
            base, temporary = default_export_base(data.context), True
        else:
            base, temporary = storage.absolute(export_directory), False
        directory = new_export_directory(base)
        try:
            paths = export_minibatches(data, batch_size, directory)
        except BaseException:
            remove_export(directory)
            raise
        evicted = []
        with self._lock:
            self.exports_written += 1
            self.files_written += len(paths)
            self._exports[key] = _Export(directory, paths, temporary)
            while len(self._exports) > self.max_exports:
                evicted.append(self._exports.popitem(last=False)[1])
        for old in evicted:
            if old.temporary:
                remove_export(old.directory)
        return list(paths)

    def delete_temp_files(self) -> int:
        """Remove every export psrv placed in its default location (never a user's export_directory);
        returns how many were removed. Forgets all exports."""
        with self._lock:
            exports = list(self._exports.values())
            self._exports.clear()
        removed = 0
        for export in exports:
            if export.temporary:
                remove_export(export.directory)
                removed += 1
        return removed

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"exports_written": self.exports_written, "files_written": self.files_written,
                    "reused": self.reused, "cached": len(self._exports)}


__all__ = [
    "DEFAULT_FS_EXPORT_ROOT",
    "ExportCache",
    "FILE_SUFFIX",
    "MAX_CACHED_EXPORTS",
    "TRAINING_APPROACHES",
    "check_training_approach",
    "default_export_base",
    "default_fs",
    "executor_hosts",
    "export_minibatches",
    "exported_minibatches",
    "files_backed",
    "new_export_directory",
    "remove_export",
    "source_key",
]
