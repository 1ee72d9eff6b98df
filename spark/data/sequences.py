"""Sequences: one CSV file per sequence (one step per line) to padded DataSets with masks.
Part of psrv.spark.data (import the names from there)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import DataSet
from psrv.spark import storage
from psrv.spark.data.batching import check_batch_size, chunked
from psrv.spark.data.files import DEFAULT_BATCH_SIZE, Record, convert_partitions, list_local_paths
from psrv.spark.data.records import _LabelSpec, parse_csv_line
from psrv.spark.errors import SparkInputError

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext


# --------------------------------------------------------------------------------------------------
# sequences: one CSV file per sequence
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _SequenceParser:
    delimiter: str
    skip_lines: int

    def __call__(self, item: tuple[str, str]) -> tuple[str, list[Record]]:
        path, text = item
        lines = text.splitlines()[self.skip_lines :]
        return path, [parse_csv_line(line, self.delimiter) for line in lines if line.strip()]


def read_sequences(
    directory: str,
    *,
    spark_context: SparkContext | None = None,
    delimiter: str = ",",
    skip_lines: int = 0,
    min_partitions: int | None = None,
) -> RDD | list[tuple[str, list[Record]]]:
    """``(path, records)`` per CSV file of ``directory`` (one sequence per file, one step per line),
    ordered by path; an RDD with ``spark_context`` (any Hadoop file system), else a list."""
    parser = _SequenceParser(delimiter, skip_lines)
    if spark_context is not None:
        return spark_context.wholeTextFiles(directory, min_partitions).sortByKey().map(parser)
    out = []
    for path in list_local_paths(directory):
        try:
            out.append(parser((path, storage.read_bytes(path).decode("utf-8"))))
        except (OSError, UnicodeDecodeError) as exc:
            raise SparkInputError(f"cannot read sequence file {path!r}: {exc}") from exc
    return out


@dataclass(frozen=True)
class _SequencesToDataSets:
    labels: _LabelSpec
    batch_size: int

    def one(self, item: Any) -> tuple[str, np.ndarray, np.ndarray]:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            name, records = item
        else:
            name, records = "<sequence>", item
        records = list(records)
        if not records:
            raise SparkInputError(f"sequence {name}: empty (no time steps)")
        try:
            features, labels = self.labels.split(records)
        except SparkInputError as exc:
            raise SparkInputError(f"sequence {name}: {exc}") from exc
        return name, features, labels

    def pack(self, items: list[tuple[str, np.ndarray, np.ndarray]]) -> DataSet:
        widths = {f.shape[1] for _, f, _ in items}
        if len(widths) > 1:
            raise SparkInputError(
                "sequences differ in feature count: " + ", ".join(f"{n}: {f.shape[1]}" for n, f, _ in items)
            )
        steps = max(f.shape[0] for _, f, _ in items)
        n = len(items)
        features = np.zeros((n, steps, widths.pop()), np.float32)
        labels = np.zeros((n, steps, items[0][2].shape[1]), np.float32)
        mask = np.zeros((n, steps), np.float32)
        for i, (_, f, lab) in enumerate(items):
            features[i, : f.shape[0]] = f
            labels[i, : lab.shape[0]] = lab
            mask[i, : f.shape[0]] = 1.0
        return DataSet(features, labels, mask, mask.copy())

    def __call__(self, sequences: Iterable[Any]) -> Iterator[DataSet]:
        for chunk in chunked(map(self.one, sequences), self.batch_size):
            yield self.pack(chunk)


def sequences_to_datasets(
    sequences: RDD | Iterable[Any],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    label_index: int | None = None,
    num_classes: int | None = None,
    label_range: tuple[int, int] | None = None,
    class_names: Sequence[str] | None = None,
) -> RDD | list[DataSet]:
    """Sequences (``(path, records)`` pairs or plain lists of step records) to padded DataSets.

    Each step's record holds its features and label (chosen as in :func:`records_to_datasets`).
    A batch is ``features (n, T, f)``, ``labels (n, T, C or k)`` with ``T`` its longest sequence;
    shorter sequences are zero-padded at the end and the masks ``(n, T)`` mark the real steps.
    """
    spec = _LabelSpec.of(label_index, num_classes, label_range, class_names)
    convert = _SequencesToDataSets(spec, check_batch_size(batch_size))
    return convert_partitions(sequences, convert)


__all__ = [
    "read_sequences",
    "sequences_to_datasets",
]
