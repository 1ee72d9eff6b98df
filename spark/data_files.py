"""Minibatch files for the data pipelines: rebatching, writing (local or any Hadoop file system),
listing and reading back. Part of psrv.spark.data (import the names from there).

Local paths (and ``file:`` URIs) are written directly by the executors, so on a multi-host cluster
they must be on a shared mount. Other Hadoop URIs (``hdfs://``, ``s3a://`` ...) are written through
the driver with Spark's Hadoop file system: correct everywhere, but every byte passes the driver.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from psrv.nn._files import write_atomically
from psrv.nn.data import DATA_FILE_SUFFIX, DataSet, MultiDataSet, read_data_bytes
from psrv.spark.batching import batches_of, check_batch_size
from psrv.spark.errors import ExportError, SparkConfigError, SparkInputError

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

Record = list[Any]  # one value per CSV column: float for numbers, str otherwise
DEFAULT_BATCH_SIZE = 32


def _is_rdd(value: Any) -> bool:
    from pyspark import RDD

    return isinstance(value, RDD)


def _convert_partitions(data: RDD | Iterable[Any], convert: Callable[[Iterable[Any]], Iterator[Any]]) -> Any:
    """``convert`` applied per partition of an RDD (lazily), or to a local iterable (into a list)."""
    return data.mapPartitions(convert) if _is_rdd(data) else list(convert(data))


# --------------------------------------------------------------------------------------------------
# minibatch files: rebatching, exporting, listing, reading back
# --------------------------------------------------------------------------------------------------
def rebatch(items: Iterable[DataSet | MultiDataSet], batch_size: int) -> Iterator[DataSet | MultiDataSet]:
    """Minibatches of exactly ``batch_size`` examples (the last may be smaller), in order."""
    yield from batches_of((_data_item(item) for item in items), batch_size)


def _data_item(item: Any) -> DataSet | MultiDataSet:
    if not isinstance(item, DataSet | MultiDataSet):
        raise SparkInputError(f"expected DataSet or MultiDataSet elements, got {type(item).__name__}")
    return item


def is_local_path(path: str) -> bool:
    """A plain path or a ``file:`` URI (written directly); anything else goes through Hadoop."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or len(scheme) == 1  # "C:" on Windows


def _local(path: str) -> str:
    if path.startswith("file:"):
        return urlparse(path).path
    return path


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


def _hadoop_fs(spark_context: SparkContext, path: str) -> tuple[Any, Any]:
    jvm = spark_context._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(spark_context._jsc.hadoopConfiguration()), hadoop_path


def write_bytes(path: str, blob: bytes, spark_context: SparkContext | None = None) -> None:
    """Write one file: local paths atomically, other URIs through Spark's Hadoop file system."""
    if is_local_path(path):
        target = _local(path)
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        try:
            write_atomically(target, blob)
        except OSError as exc:
            raise ExportError(f"cannot write {path!r}: {exc}") from exc
        return
    if spark_context is None:
        raise SparkConfigError(f"{path!r} is not a local path: a SparkContext is needed to write it")
    _hadoop_write(spark_context, path, blob)


def _hadoop_write(spark_context: SparkContext, path: str, blob: bytes) -> None:
    """Write (overwrite) one file through Spark's Hadoop file system."""
    fs, hadoop_path = _hadoop_fs(spark_context, path)
    stream = fs.create(hadoop_path, True)
    try:
        stream.write(bytearray(blob))
    finally:
        stream.close()


def _file_name(partition: int, number: int, suffix: str = DATA_FILE_SUFFIX) -> str:
    return f"part-{partition:05d}-{number:06d}{suffix}"


@dataclass(frozen=True)
class _PartitionExporter:
    """Executor side of batch_and_export: rebatch, then write (local) or hand back bytes (remote)."""

    directory: str
    batch_size: int
    write_here: bool

    def __call__(self, partition: int, items: Iterable[Any]) -> Iterator[tuple[str, bytes | None]]:
        for number, batch in enumerate(rebatch(items, self.batch_size)):
            path = _join(self.directory, _file_name(partition, number))
            if self.write_here:
                write_bytes(path, batch.to_bytes())
                yield path, None
            else:
                yield path, batch.to_bytes()


def _absolute(directory: str) -> str:
    """Executors run in other working directories: ship absolute local paths."""
    if directory.startswith("file:"):
        return "file://" + os.path.abspath(_local(directory))
    if is_local_path(directory):
        return os.path.abspath(directory)
    return directory


def batch_and_export(
    rdd: RDD, batch_size: int, path: str, *, through_driver: bool | None = None
) -> list[str]:
    """Write ``rdd``'s DataSets/MultiDataSets as files of ``batch_size`` examples under directory
    ``path``; returns the file paths, sorted (partition, then position).

    Local paths are written by the executors themselves; other URIs (``hdfs://`` ...) are streamed
    to the driver and written there with Spark's Hadoop file system (``through_driver=True`` forces
    that for any path).
    """
    directory = _absolute(path)
    via_driver = (not is_local_path(directory)) if through_driver is None else bool(through_driver)
    exporter = _PartitionExporter(directory, check_batch_size(batch_size), not via_driver)
    produced = rdd.mapPartitionsWithIndex(exporter)
    if not via_driver:
        return sorted(p for p, _ in produced.collect())
    paths = []
    for file_path, blob in produced.toLocalIterator():
        write_bytes(file_path, blob, rdd.context)
        paths.append(file_path)
    return sorted(paths)


def export_datasets(
    datasets: Iterable[DataSet | MultiDataSet],
    directory: str,
    *,
    batch_size: int | None = None,
    prefix: str = "batch",
) -> list[str]:
    """Single-machine export: each DataSet (re-batched to ``batch_size`` if given) to one file."""
    items = rebatch(datasets, batch_size) if batch_size is not None else datasets
    paths = []
    for number, batch in enumerate(items):
        if not isinstance(batch, DataSet | MultiDataSet):
            raise SparkInputError(f"expected DataSet or MultiDataSet items, got {type(batch).__name__}")
        file_path = _join(directory, f"{prefix}-{number:06d}{DATA_FILE_SUFFIX}")
        write_bytes(file_path, batch.to_bytes())
        paths.append(file_path)
    return paths


def _visible(name: str) -> bool:
    return not name.startswith((".", "_"))


def list_local_paths(directory: str, *, suffix: str | None = None, recursive: bool = True) -> list[str]:
    """Sorted files under a local directory (hidden and ``_``-prefixed names, like _SUCCESS, skipped)."""
    root = _local(directory)
    if not os.path.isdir(root):
        raise SparkInputError(f"{directory!r} is not a directory")
    out = []
    for current, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if _visible(d)) if recursive else []
        out.extend(
            os.path.join(current, f) for f in files if _visible(f) and (suffix is None or f.endswith(suffix))
        )
    return sorted(out)


def list_paths(
    spark_context: SparkContext | None, directory: str, *, suffix: str | None = None, recursive: bool = True
) -> list[str]:
    """Sorted file paths under ``directory`` on any Hadoop file system (local without a SparkContext).

    A local directory given without a scheme yields plain local paths; URIs yield URIs.
    """
    if spark_context is None:
        return list_local_paths(directory, suffix=suffix, recursive=recursive)
    from py4j.protocol import Py4JJavaError

    fs, hadoop_path = _hadoop_fs(spark_context, directory)
    try:
        if not fs.getFileStatus(hadoop_path).isDirectory():
            raise SparkInputError(f"{directory!r} is not a directory")
        iterator = fs.listFiles(hadoop_path, recursive)
        found = []
        while iterator.hasNext():
            found.append(iterator.next().getPath().toString())
    except Py4JJavaError as exc:
        raise SparkInputError(f"cannot list {directory!r}: {exc.java_exception.toString()}") from exc
    plain = urlparse(directory).scheme == ""
    out = []
    for uri in found:
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        if not _visible(name) or (suffix is not None and not name.endswith(suffix)):
            continue
        if uri.startswith("file:"):  # Hadoop writes "file:/x"; answer in the form the caller used
            local = urlparse(uri).path
            uri = local if plain else ("file://" + local if directory.startswith("file://") else uri)
        out.append(uri)
    return sorted(out)


def _decode_file(item: tuple[str, bytes]) -> DataSet | MultiDataSet:
    path, blob = item
    return read_data_bytes(blob, path)


def read_exported(spark_context: SparkContext, path: str, *, min_partitions: int | None = None) -> RDD:
    """An RDD of the DataSets/MultiDataSets in the minibatch files under ``path`` (any Hadoop URI)."""
    return spark_context.binaryFiles(path, min_partitions).map(_decode_file)
