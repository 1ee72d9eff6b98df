"""Parquet as training input and as a minibatch file format, read with Arrow inside the tasks.

- A DataFrame that is a plain scan of Parquet files (``spark.read.parquet(...)``, optionally with
  columns selected) is read by the tasks themselves: each task opens its files through the storage
  layer and turns Arrow record batches straight into DataSets, without Spark's row-by-row Python
  conversion and without exporting psrv files first. ``SparkNetwork.fit`` sends any other DataFrame
  down the row path; the Spark ML estimators (psrv.spark.ml) send it through ``mapInArrow``
  (:func:`arrow_datasets`): Spark hands the task Arrow batches, the task makes DataSets of them.
- ``batch_and_export(..., file_format="parquet")`` writes each minibatch as one Parquet file
  (columns ``features`` and ``labels``, fixed-size lists of float32 with the shapes in the file's
  metadata); :class:`ParquetDataSetLoader` reads them back.

Needs pyarrow (``pip install 'psrv[parquet]'``) on the driver and the executors.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np
from psrv.nn.data import DataSet
from psrv.spark import storage
from psrv.spark.errors import SparkConfigError, SparkInputError

if TYPE_CHECKING:
    from pyspark import RDD

log = logging.getLogger(__name__)

PARQUET_SUFFIX = ".parquet"
ROWS_PER_DATASET = 1024
_SHAPES_KEY = b"psrv.shapes"


def pyarrow_available() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def require_pyarrow() -> Any:
    """pyarrow (with its Parquet module), or a SparkConfigError saying how to install it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise SparkConfigError("Parquet input and output need pyarrow: pip install 'psrv[parquet]'") from exc
    return pa


# --------------------------------------------------------------------------------------------------
# Arrow columns to numpy
# --------------------------------------------------------------------------------------------------
def _vectors(column: Any, name: str, source: str = "Parquet") -> np.ndarray:
    """(n, k) float32 from a numeric, list, fixed-size-list or Spark ML Vector (struct) column; ``source``
    names what the column belongs to in messages (a Parquet file, a DataFrame ...)."""
    pa = require_pyarrow()
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if column.null_count:
        raise SparkInputError(f"{source} column {name!r}: expected numbers, got {column.null_count} null(s)")
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return column.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, 1)
    if pa.types.is_fixed_size_list(kind):
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.astype(np.float32, copy=False).reshape(len(column), kind.list_size)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = column.offsets.to_numpy()
        lengths = np.diff(offsets)
        if lengths.size and (lengths != lengths[0]).any():
            raise SparkInputError(
                f"{source} column {name!r}: expected arrays of one length, got lengths "
                f"{int(lengths.min())}..{int(lengths.max())}"
            )
        values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        return values.reshape(len(column), int(lengths[0]) if lengths.size else 0)
    if pa.types.is_struct(kind) and {"type", "size", "indices", "values"} <= {f.name for f in kind}:
        return _ml_vectors(column, name, source)
    raise SparkInputError(
        f"{source} column {name!r}: expected numbers, arrays of numbers or ML Vectors, got {kind}"
    )


def _ml_vectors(column: Any, name: str, source: str) -> np.ndarray:
    """Spark ML's VectorUDT as stored in Parquet: struct<type: 0 sparse / 1 dense, size, indices, values>."""
    kinds = column.field("type").to_numpy(zero_copy_only=False)
    if (kinds == 1).all():  # dense only (VectorAssembler's usual output): the values column as it is
        return _vectors(column.field("values"), name, source)
    values = column.field("values").to_pylist()
    sizes = column.field("size").to_pylist()
    indices = column.field("indices").to_pylist()
    width = max((int(s) for s, k in zip(sizes, kinds, strict=True) if k == 0), default=0)
    width = max(width, max((len(v) for v, k in zip(values, kinds, strict=True) if k == 1), default=0))
    out = np.zeros((len(kinds), width), np.float32)
    for row, (kind, idx, vals) in enumerate(zip(kinds, indices, values, strict=True)):
        if kind == 1:
            out[row, : len(vals)] = vals
        else:
            out[row, np.asarray(idx, dtype=np.int64)] = vals
    if not np.isfinite(out).all():
        raise SparkInputError(f"{source} column {name!r}: holds non-finite values")
    return out


@dataclass(frozen=True)
class ParquetColumns:
    """Which columns hold features and labels, and how labels become label vectors. ``features_col``
    may name several columns (numbers, arrays or ML Vectors): their values are concatenated in order."""

    features_col: str | tuple[str, ...] = "features"
    label_col: str = "label"
    num_classes: int | None = None
    source: str = "Parquet"  # what the columns belong to, in messages ("DataFrame" for mapInArrow's batches)
    binary: bool = False  # labels must be 0 or 1 (a binary loss's one output), kept as they are
    positions: int = 1  # class indices per row (a tagger's steps, a map's pixels), one-hot per position
    classes_last: bool = True  # where the one-hot classes go per example: last (T, k) or first (C, H, W)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return (self.features_col,) if isinstance(self.features_col, str) else tuple(self.features_col)

    @property
    def names(self) -> list[str]:
        """Every column read, features first (a column may not be both)."""
        return [*self.feature_names, self.label_col]

    def to_dataset(self, table: Any, first_row: int = 0) -> DataSet:
        """One DataSet of ``table``; ``first_row`` (the table's first row in the task's input) places a
        bad label in messages."""
        parts = [_vectors(table.column(name), name, self.source) for name in self.feature_names]
        features = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        labels = _vectors(table.column(self.label_col), self.label_col, self.source)
        if self.positions > 1:
            labels = position_one_hot(labels, int(self.num_classes or 0), self.positions, self.classes_last,
                                      self.label_col, self.source, first_row)
        elif self.num_classes is not None or self.binary:
            classes = 2 if self.binary else int(self.num_classes or 0)
            if labels.shape[1] != 1:
                raise SparkInputError(
                    f"{self.source} column {self.label_col!r}: expected one class index per row, got "
                    f"{labels.shape[1]} values"
                )
            check_class_indices(labels[:, 0], classes, self.label_col, self.source, first_row)
            if not self.binary:
                labels = np.eye(classes, dtype=np.float32)[labels[:, 0].astype(np.int64)]
        return DataSet(features, labels)


def position_one_hot(labels: np.ndarray, num_classes: int, positions: int, classes_last: bool, column: str,
                     source: str, first_row: int) -> np.ndarray:
    """(n, positions) class indices as (n, positions * num_classes) one-hot rows in the module's layout,
    flattened: classes last ((T, k), a tagger) or first ((C, H, W), a map), as psrv.nn.torch_shapes reads a
    flat label row. Rows that already hold the output's whole shape (one-hot or class probabilities per
    position, in that layout) are kept as they are. The values are checked first, naming the column and
    the row."""
    full = positions * num_classes
    if labels.shape[1] == full:  # the module's own shape, flattened: probabilities per element
        values = np.ascontiguousarray(labels, dtype=np.float32)
        bad = ~np.isfinite(values) | (values < 0) | (values > 1)
        if values.size and bad.any():
            at = int(np.argmax(bad.reshape(-1)))
            raise SparkInputError(
                f"{source} column {column!r}: row {first_row + at // full} of this task's input holds "
                f"{float(values.reshape(-1)[at])!r} at element {at % full}; a row of {full} values is read "
                "as one-hot or class probabilities per position, in [0, 1]")
        return values
    if labels.shape[1] != positions:
        raise SparkInputError(
            f"{source} column {column!r}: expected {positions} class indices per row (one per position), "
            f"or {full} one-hot or probability values (the output's shape, flattened), got "
            f"{labels.shape[1]} values")
    flat = labels.reshape(-1)
    bad = ~np.isfinite(flat) | (flat != np.floor(flat)) | (flat < 0) | (flat >= num_classes)
    if flat.size and bad.any():
        at = int(np.argmax(bad))
        raise SparkInputError(
            f"{source} column {column!r}: row {first_row + at // positions} of this task's input holds "
            f"{float(flat[at])!r} at position {at % positions}; expected integral class indices in "
            f"[0, {num_classes})")
    one_hot = np.eye(num_classes, dtype=np.float32)[labels.astype(np.int64)]  # (n, P, k)
    if not classes_last:
        one_hot = np.moveaxis(one_hot, 2, 1)  # (n, k, P)
    return np.ascontiguousarray(one_hot).reshape(len(labels), -1)


def check_class_indices(values: np.ndarray, num_classes: int, column: str, source: str,
                        first_row: int) -> None:
    """Refuse a label that is not an integral class index in ``[0, num_classes)``, naming the column,
    the value and its row (``first_row`` + its position here)."""
    bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < 0) | (values >= num_classes)
    if values.size and bad.any():
        row = int(np.argmax(bad))
        raise SparkInputError(
            f"{source} column {column!r}: row {first_row + row} of this task's input holds "
            f"{float(values[row])!r}; expected integral class indices in [0, {num_classes}) "
            f"({int(bad.sum())} such value(s) here)"
        )


@dataclass(frozen=True)
class ParquetFileReader:
    """Task side: each Parquet file of the partition, opened through the storage layer, as DataSets of
    up to ``rows`` examples (Arrow record batches converted column-wise, no per-row Python)."""

    columns: ParquetColumns
    rows: int
    options: dict[str, dict[str, Any]]

    def __call__(self, paths: Iterator[str]) -> Iterator[DataSet]:
        import pyarrow.parquet as pq

        require_pyarrow()
        storage.configure(self.options)
        wanted = self.columns.names
        for path in paths:
            with storage.open_input(path) as stream:
                parquet = pq.ParquetFile(stream)
                missing = [c for c in wanted if c not in parquet.schema_arrow.names]
                if missing:
                    raise SparkInputError(
                        f"{path}: Parquet file lacks column(s) {missing}; it has {parquet.schema_arrow.names}"
                    )
                first_row = 0
                for batch in parquet.iter_batches(batch_size=self.rows, columns=wanted):
                    if batch.num_rows:
                        yield self.columns.to_dataset(batch, first_row)
                    first_row += batch.num_rows


# --------------------------------------------------------------------------------------------------
# DataFrames backed by Parquet
# --------------------------------------------------------------------------------------------------
def parquet_files(frame: Any) -> list[str] | None:
    """The files of a DataFrame that is a plain Parquet scan (columns may be selected), else None."""
    try:
        plan = str(frame._jdf.queryExecution().optimizedPlan().toString())
        # Spark answers percent-encoded URIs ("a%20b"); psrv's storage layer takes them as written
        files = [unquote(str(f)) for f in frame.inputFiles()]
    except Exception:  # noqa: BLE001 - not a JVM-backed DataFrame (Spark Connect ...): the row path
        return None
    lines = [line.strip().lstrip("+-: ").strip() for line in plan.strip().splitlines() if line.strip()]
    relations = [line for line in lines if line.startswith("Relation")]
    # a Project that computes or renames a column ("... AS name", e.g. a VectorAssembler's output) reads
    # columns the files do not hold under that name: not a plain scan
    plain = len(relations) == 1 and relations[0].endswith("parquet") and all(
        line.startswith("Relation") or (line.startswith("Project") and " AS " not in line) for line in lines
    )
    if not plain or not files:
        return None
    return sorted(files)


def parquet_datasets(frame: Any, columns: ParquetColumns, *, rows: int = ROWS_PER_DATASET) -> RDD | None:
    """An RDD of DataSets read with Arrow in the tasks, when ``frame`` is a plain Parquet scan and
    pyarrow is here; None otherwise (the caller takes the row path)."""
    if not pyarrow_available():
        return None
    files = parquet_files(frame)
    if files is None:
        return None
    for column in columns.names:
        if column not in frame.columns:
            return None
    context = frame.sparkSession.sparkContext
    options = storage.use_hadoop_configuration(context)
    slices = max(1, min(len(files), int(context.defaultParallelism)))
    rdd = context.parallelize(files, slices).mapPartitions(ParquetFileReader(columns, rows, options))
    rdd._psrv_parquet_files = files
    return rdd


# --------------------------------------------------------------------------------------------------
# Any DataFrame: Arrow batches from Spark (mapInArrow)
# --------------------------------------------------------------------------------------------------
ARROW_DATASET_COLUMN = "psrv_dataset"


@dataclass(frozen=True)
class ArrowBatchConverter:
    """Task side of ``mapInArrow``: Spark's Arrow record batches of the selected columns, sliced into
    DataSets of up to ``rows`` examples (column-wise, no per-row Python); each DataSet leaves the task
    as one binary cell, so the JVM moves one value per minibatch instead of one row per example."""

    columns: ParquetColumns
    rows: int

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pickle

        import pyarrow as pa

        first_row = 0
        for batch in batches:
            for start in range(0, batch.num_rows, self.rows):
                dataset = self.columns.to_dataset(batch.slice(start, self.rows), first_row + start)
                blob = pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
                yield pa.RecordBatch.from_arrays([pa.array([blob], pa.binary())], [ARROW_DATASET_COLUMN])
            first_row += batch.num_rows


def _unpickle_dataset(row: Any) -> DataSet:
    import pickle

    return pickle.loads(row[0])


def arrow_datasets(frame: Any, columns: ParquetColumns, *, rows: int = ROWS_PER_DATASET) -> RDD | None:
    """An RDD of DataSets from any DataFrame through ``mapInArrow`` (Spark's Arrow batches, converted in
    the tasks); None where that is not possible (no pyarrow, no ``mapInArrow``, Spark Connect)."""
    if not pyarrow_available() or not hasattr(frame, "mapInArrow"):
        return None
    for column in columns.names:
        if column not in frame.columns:
            return None
    try:
        mapped = frame.select(*columns.names).mapInArrow(
            ArrowBatchConverter(columns, rows), f"{ARROW_DATASET_COLUMN} binary")
        rdd = mapped.rdd.map(_unpickle_dataset)
    except Exception as exc:  # noqa: BLE001 - no pandas (PySpark requires it), Spark Connect (no .rdd) ...
        log.info("DataFrame read through Spark's rows, not Arrow (mapInArrow: %s)", exc)
        return None
    rdd._psrv_arrow = True
    return rdd


# --------------------------------------------------------------------------------------------------
# Parquet as the minibatch file format
# --------------------------------------------------------------------------------------------------
def dataset_to_parquet(batch: DataSet) -> bytes:
    """One minibatch as a Parquet file: ``features`` and ``labels`` (and the masks a sequence batch has)
    as fixed-size lists of float32, the per-example shapes in the schema metadata (so (n, h, w, c)
    features and (n, T) masks come back as they were)."""
    pa = require_pyarrow()
    import pyarrow.parquet as pq

    columns = {}
    shapes = {}
    named = [("features", batch.features), ("labels", batch.labels), ("features_mask", batch.features_mask),
             ("labels_mask", batch.labels_mask)]
    for name, array in named:
        if array is None:
            continue
        flat = np.ascontiguousarray(array, dtype=np.float32).reshape(batch.num_examples, -1)
        columns[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
        shapes[name] = list(array.shape[1:])
    table = pa.table(columns).replace_schema_metadata({_SHAPES_KEY: json.dumps(shapes).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def dataset_from_parquet(stream: Any, source: str) -> DataSet:
    require_pyarrow()
    import pyarrow.parquet as pq

    table = pq.read_table(stream)
    meta = table.schema.metadata or {}
    try:
        shapes = json.loads(meta[_SHAPES_KEY])
    except (KeyError, ValueError) as exc:
        raise SparkInputError(
            f"{source}: not a psrv Parquet minibatch (no {_SHAPES_KEY.decode()} metadata)"
        ) from exc
    arrays = {}
    for name in ("features", "labels", "features_mask", "labels_mask"):
        if name in shapes:
            flat = _vectors(table.column(name), name)
            arrays[name] = flat.reshape((table.num_rows, *shapes[name]))
    return DataSet(arrays["features"], arrays["labels"], arrays.get("features_mask"),
                   arrays.get("labels_mask"))


class ParquetDataSetLoader:
    """Reads the Parquet minibatch files ``batch_and_export(..., file_format="parquet")`` writes."""

    def load(self, path: str) -> DataSet:
        with storage.open_input(path) as stream:
            return self.load_stream(stream, path)

    def load_stream(self, stream: Any, path: str) -> DataSet:
        return dataset_from_parquet(stream, path)

    def __repr__(self) -> str:
        return "ParquetDataSetLoader()"


__all__ = [
    "ARROW_DATASET_COLUMN",
    "PARQUET_SUFFIX",
    "ArrowBatchConverter",
    "ParquetColumns",
    "ParquetDataSetLoader",
    "ParquetFileReader",
    "check_class_indices",
    "require_pyarrow",
    "arrow_datasets",
    "dataset_from_parquet",
    "dataset_to_parquet",
    "parquet_datasets",
    "parquet_files",
]
