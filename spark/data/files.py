"""Minibatch files for the data pipelines: rebatching, writing, listing and reading back. Part of
psrv.spark.data (import the names from there).

Every path goes through the storage layer (:mod:`psrv.spark.storage`): local paths, ``file:`` URIs and
any Hadoop-FS URI its backends reach. Executors write their own files; nothing passes the driver
unless ``through_driver=True`` asks for it (for a cluster whose executors lack fsspec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psrv.nn.data import DATA_FILE_SUFFIX, DataSet, MultiDataSet, read_data_bytes
from psrv.spark import storage
from psrv.spark.data.batching import check_batch_size, rebatch
from psrv.spark.data.parquet import dataset_to_parquet, require_pyarrow
from psrv.spark.errors import ExportError, SparkInputError, StorageError

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

Record = list[Any]  # one value per CSV column: float for numbers, str otherwise
DEFAULT_BATCH_SIZE = 32


def is_rdd(value: Any) -> bool:
    """Whether ``value`` is a Spark RDD (the pipelines also take plain iterables)."""
    from pyspark import RDD

    return isinstance(value, RDD)


def convert_partitions(data: RDD | Iterable[Any], convert: Callable[[Iterable[Any]], Iterator[Any]]) -> Any:
    """``convert`` applied per partition of an RDD (lazily), or to a local iterable (into a list)."""
    return data.mapPartitions(convert) if is_rdd(data) else list(convert(data))


# --------------------------------------------------------------------------------------------------
# minibatch files: exporting, listing, reading back
# --------------------------------------------------------------------------------------------------
def write_bytes(path: str, blob: bytes, spark_context: SparkContext | None = None) -> None:
    """Write one file atomically through the storage layer (``spark_context`` is no longer needed:
    kept for callers that pass it)."""
    try:
        storage.write_bytes(path, blob)
    except StorageError as exc:
        raise ExportError(str(exc)) from exc


def _file_name(partition: int, number: int, suffix: str = DATA_FILE_SUFFIX) -> str:
    return f"part-{partition:05d}-{number:06d}{suffix}"


@dataclass(frozen=True)
class _PartitionExporter:
    """Executor side of batch_and_export: rebatch, then write (here) or hand back bytes (to the driver)."""

    directory: str
    batch_size: int
    write_here: bool
    options: dict[str, dict[str, Any]]

    file_format: str = "psds"

    def __call__(self, partition: int, items: Iterable[Any]) -> Iterator[tuple[str, bytes | None]]:
        storage.configure(self.options)
        parquet = self.file_format == "parquet"
        suffix = ".parquet" if parquet else DATA_FILE_SUFFIX
        for number, batch in enumerate(rebatch(items, self.batch_size, single_to_dataset=False)):
            path = storage.join(self.directory, _file_name(partition, number, suffix))
            if parquet:
                blob = dataset_to_parquet(batch if isinstance(batch, DataSet) else batch.to_dataset())
            else:
                blob = batch.to_bytes()
            if self.write_here:
                write_bytes(path, blob)
                yield path, None
            else:
                yield path, blob


FILE_FORMATS = ("psds", "parquet")


def batch_and_export(
    rdd: RDD | Iterable[Any], batch_size: int, path: str, *, through_driver: bool = False,
    file_format: str = "psds",
) -> list[str]:
    """Write ``rdd``'s DataSets/MultiDataSets as files of ``batch_size`` examples under directory
    ``path`` (any storage-layer URI); returns the file paths, sorted (partition, then position).

    The executors write their files themselves; ``through_driver=True`` streams every minibatch to
    the driver, which writes it (for a cluster whose executors cannot reach the URI's file system).
    ``file_format="parquet"`` writes each minibatch as a Parquet file (read it back with
    ``psrv.spark.data.parquet.ParquetDataSetLoader``; DataSets without masks). A plain iterable
    instead of an RDD is written here, in this process, as one partition (the same file names).
    """
    if file_format not in FILE_FORMATS:
        raise SparkInputError(f"file_format: expected one of {FILE_FORMATS}, got {file_format!r}")
    if file_format == "parquet":
        require_pyarrow()  # a missing pyarrow fails here, on the driver
    directory = storage.absolute(path)
    if not is_rdd(rdd):
        local = _PartitionExporter(directory, check_batch_size(batch_size), True, storage.current_options(),
                                   file_format)
        return sorted(p for p, _ in local(0, rdd))
    if not through_driver:
        storage.check_task_access(directory, "batch_and_export: path")
    options = storage.use_hadoop_configuration(rdd.context)
    exporter = _PartitionExporter(directory, check_batch_size(batch_size), not through_driver, options,
                                  file_format)
    produced = rdd.mapPartitionsWithIndex(exporter)
    if not through_driver:
        return sorted(p for p, _ in produced.collect())
    paths = []
    for file_path, blob in produced.toLocalIterator():
        write_bytes(file_path, blob)
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
    items = rebatch(datasets, batch_size, single_to_dataset=False) if batch_size is not None else datasets
    paths = []
    for number, batch in enumerate(items):
        if not isinstance(batch, DataSet | MultiDataSet):
            raise SparkInputError(f"expected DataSet or MultiDataSet items, got {type(batch).__name__}")
        file_path = storage.join(directory, f"{prefix}-{number:06d}{DATA_FILE_SUFFIX}")
        write_bytes(file_path, batch.to_bytes())
        paths.append(file_path)
    return paths


def list_local_paths(directory: str, *, suffix: str | None = None, recursive: bool = True) -> list[str]:
    """Sorted files under a directory (hidden and ``_``-prefixed names, like _SUCCESS, skipped)."""
    try:
        return storage.list_files(directory, suffix=suffix, recursive=recursive)
    except StorageError as exc:
        raise SparkInputError(str(exc)) from exc


def list_paths(
    spark_context: SparkContext | None, directory: str, *, suffix: str | None = None, recursive: bool = True,
    as_rdd: bool = False, num_slices: int | None = None,
) -> list[str] | RDD:
    """Sorted file paths under ``directory`` on any storage-layer file system, in the form the caller
    used (a plain local directory lists plain paths, a URI lists URIs). ``spark_context`` is optional,
    except with ``as_rdd=True``: the paths then come as an RDD (``num_slices`` partitions, default
    Spark's default parallelism, never more than the paths), ready for ``fit_paths``."""
    if as_rdd and spark_context is None:
        raise SparkInputError("list_paths(as_rdd=True) needs a SparkContext: pass it as the first argument")
    if spark_context is not None:
        storage.use_hadoop_configuration(spark_context)
    paths = list_local_paths(directory, suffix=suffix, recursive=recursive)
    if not as_rdd:
        return paths
    slices = num_slices if num_slices is not None else int(spark_context.defaultParallelism)
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise SparkInputError(f"list_paths: num_slices must be a positive int, got {num_slices!r}")
    return spark_context.parallelize(paths, max(1, min(slices, len(paths))))


def _decode_file(item: tuple[str, bytes]) -> DataSet | MultiDataSet:
    path, blob = item
    return read_data_bytes(blob, path)


def read_exported(spark_context: SparkContext, path: str, *, min_partitions: int | None = None) -> RDD:
    """An RDD of the DataSets/MultiDataSets in the minibatch files under ``path`` (any Hadoop URI)."""
    return spark_context.binaryFiles(path, min_partitions).map(_decode_file)


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "convert_partitions",
    "is_rdd",
    "FILE_FORMATS",
    "Record",
    "batch_and_export",
    "export_datasets",
    "list_local_paths",
    "list_paths",
    "read_exported",
    "write_bytes",
]
