"""psrv.spark.data: data pipelines from CSV text, record RDDs and sequence files to minibatches.

Every function takes either a Spark RDD (and returns an RDD, lazily) or a plain Python iterable
(and returns a list / iterator), so the same pipeline runs on a cluster and on one machine.

- A **record** is a list of values, one per CSV column: numbers become floats, anything else stays
  a string (``parse_csv_line``).
- ``records_to_datasets``: classification (``label_index`` + ``num_classes``: one-hot labels) or
  regression (``label_range=(start, stop)``, half-open); every other column is a feature.
- ``records_to_multidatasets``: several named record sources, joined on a key column (or by
  position), inputs/outputs taken from column ranges (``MultiDataSetSpec``).
- ``read_sequences`` + ``sequences_to_datasets``: one sequence per CSV file (one time step per line)
  to padded ``(n, T, f)`` DataSets with ``(n, T)`` masks.
- ``batch_and_export`` / ``export_datasets`` write one minibatch per file; ``list_paths`` lists them;
  ``read_exported`` reads them back through Spark (any Hadoop file system).
- ``pack_images`` + ``ImageDataSetLoader``: image folders to ``.psimg`` batch files and back;
  ``ParquetDataSetLoader`` reads minibatches exported as Parquet.

Paths: every path is a local path or a URI of the storage layer (``psrv.spark.storage``:
``file://``, ``hdfs://``, ``s3a://`` ...); the executors write and read their files themselves.
"""

from __future__ import annotations

from psrv.spark.data.batching import rebatch
from psrv.spark.data.files import (
    DEFAULT_BATCH_SIZE,
    Record,
    batch_and_export,
    export_datasets,
    list_local_paths,
    list_paths,
    read_exported,
    write_bytes,
)
from psrv.spark.data.images import (
    ImageBatch,
    ImageDataSetLoader,
    PackedImages,
    decode_image,
    label_of,
    pack_images,
)
from psrv.spark.data.parquet import ParquetDataSetLoader
from psrv.spark.data.records import (
    ColumnRange,
    MultiDataSetSpec,
    OneHotColumn,
    csv_to_records,
    parse_csv_line,
    read_csv,
    records_to_datasets,
    records_to_multidatasets,
)
from psrv.spark.data.sequences import read_sequences, sequences_to_datasets

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "ImageBatch",
    "ImageDataSetLoader",
    "PackedImages",
    "ParquetDataSetLoader",
    "decode_image",
    "label_of",
    "pack_images",
    "ColumnRange",
    "MultiDataSetSpec",
    "OneHotColumn",
    "Record",
    "batch_and_export",
    "csv_to_records",
    "export_datasets",
    "list_local_paths",
    "list_paths",
    "parse_csv_line",
    "read_csv",
    "read_exported",
    "read_sequences",
    "rebatch",
    "records_to_datasets",
    "records_to_multidatasets",
    "sequences_to_datasets",
    "write_bytes",
]
