"""CSV text to records, and records to DataSets and (joined) MultiDataSets.
Part of psrv.spark.data (import the names from there)."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import DataSet, MultiDataSet
from psrv.spark import storage
from psrv.spark.data.batching import check_batch_size, chunked
from psrv.spark.data.files import (
    DEFAULT_BATCH_SIZE,
    Record,
    convert_partitions,
    is_rdd,
    list_local_paths,
)
from psrv.spark.errors import SparkConfigError, SparkInputError

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext


# --------------------------------------------------------------------------------------------------
# CSV text to records
# --------------------------------------------------------------------------------------------------
def _value(text: str) -> float | str:
    stripped = text.strip()
    try:
        return float(stripped)
    except ValueError:
        return stripped


def parse_csv_line(line: str, delimiter: str = ",", quotechar: str = '"') -> Record:
    """One CSV line to a record: numeric fields become floats, others stay (stripped) strings."""
    fields = next(csv.reader([line], delimiter=delimiter, quotechar=quotechar), [])
    return [_value(f) for f in fields]


@dataclass(frozen=True)
class _LineParser:
    delimiter: str
    quotechar: str
    comment: str | None

    def keep(self, line: str) -> bool:
        stripped = line.strip()
        return bool(stripped) and not (self.comment and stripped.startswith(self.comment))

    def __call__(self, line: str) -> Record:
        return parse_csv_line(line, self.delimiter, self.quotechar)


def csv_to_records(
    lines: RDD | Iterable[str],
    *,
    delimiter: str = ",",
    quotechar: str = '"',
    skip_lines: int = 0,
    comment: str | None = None,
) -> RDD | list[Record]:
    """CSV lines (an RDD of str, or any iterable) to records; blank and comment lines are dropped.

    ``skip_lines`` drops the first lines of the whole input (a header of the first file; give
    header-free files when reading a directory of several).
    """
    parser = _LineParser(delimiter, quotechar, comment)
    if is_rdd(lines):
        if skip_lines:
            lines = lines.zipWithIndex().filter(lambda pair: pair[1] >= skip_lines).keys()
        return lines.filter(parser.keep).map(parser)
    out = []
    for number, line in enumerate(lines):
        if number >= skip_lines and parser.keep(line):
            out.append(parser(line))
    return out


def read_csv(
    path: str,
    *,
    spark_context: SparkContext | None = None,
    min_partitions: int | None = None,
    **options: Any,
) -> RDD | list[Record]:
    """Records from a CSV file or a directory of CSV files (an RDD when ``spark_context`` is given).

    ``options`` are those of :func:`csv_to_records`. Without Spark the storage layer reads the path
    (local or any URI it reaches).
    """
    if spark_context is not None:
        return csv_to_records(spark_context.textFile(path, min_partitions), **options)
    files = list_local_paths(path) if storage.is_dir(path) else [path]
    lines: list[str] = []
    for name in files:
        try:
            file_lines = storage.read_bytes(name).decode("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SparkInputError(f"cannot read CSV file {name!r}: {exc}") from exc
        lines.extend(file_lines)
    return csv_to_records(lines, **options)


# --------------------------------------------------------------------------------------------------
# records to DataSets
# --------------------------------------------------------------------------------------------------
def _number(value: Any, row: int, column: int) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise SparkInputError(f"record {row}, column {column}: expected a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class _LabelSpec:
    """Which columns are labels and how they become label vectors."""

    label_index: int | None = None
    num_classes: int | None = None
    label_range: tuple[int, int] | None = None
    class_names: tuple[str, ...] | None = None

    @classmethod
    def of(
        cls,
        label_index: int | None,
        num_classes: int | None,
        label_range: tuple[int, int] | None,
        class_names: Sequence[str] | None,
    ) -> _LabelSpec:
        if (label_index is None) == (label_range is None):
            raise SparkConfigError(
                "expected exactly one of label_index (classification) or label_range (regression), got "
                f"label_index={label_index!r}, label_range={label_range!r}"
            )
        if label_index is not None:
            if class_names is not None:
                if num_classes is not None and num_classes != len(class_names):
                    raise SparkConfigError(
                        f"num_classes={num_classes} but {len(class_names)} class_names were given"
                    )
                num_classes = len(class_names)
            if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
                raise SparkConfigError(
                    f"num_classes: expected a positive int for classification, got {num_classes!r}"
                )
            return cls(
                int(label_index), num_classes, None, None if class_names is None else tuple(class_names)
            )
        assert label_range is not None
        start, stop = (int(v) for v in label_range)
        if not (0 <= start < stop):
            raise SparkConfigError(
                f"label_range: expected (start, stop) with 0 <= start < stop, got {label_range!r}"
            )
        return cls(None, None, (start, stop), None)

    def label_columns(self, width: int) -> list[int]:
        if self.label_index is not None:
            index = self.label_index + width if self.label_index < 0 else self.label_index
            if not 0 <= index < width:
                raise SparkInputError(f"label_index {self.label_index} is outside records of {width} columns")
            return [index]
        assert self.label_range is not None
        start, stop = self.label_range
        if stop > width:
            raise SparkInputError(f"label_range {self.label_range} is outside records of {width} columns")
        return list(range(start, stop))

    def class_index(self, value: Any, row: int, column: int) -> int:
        assert self.num_classes is not None
        if isinstance(value, str):
            if self.class_names is None or value not in self.class_names:
                known = "" if self.class_names is None else f" (known: {list(self.class_names)})"
                raise SparkInputError(f"record {row}, column {column}: unknown class label {value!r}{known}")
            return self.class_names.index(value)
        number = _number(value, row, column)
        if number != math.floor(number) or not 0 <= number < self.num_classes:
            raise SparkInputError(
                f"record {row}, column {column}: expected a class index in [0, {self.num_classes}), "
                f"got {value!r}"
            )
        return int(number)

    def split(self, rows: Sequence[Record], first_row: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(features float32 (n, f), labels float32 (n, C or k)) of equal-width records."""
        width = len(rows[0])
        labels_at = self.label_columns(width)
        features_at = [c for c in range(width) if c not in labels_at]
        features = np.empty((len(rows), len(features_at)), np.float32)
        if self.label_index is not None:
            assert self.num_classes is not None
            labels = np.zeros((len(rows), self.num_classes), np.float32)
        else:
            labels = np.empty((len(rows), len(labels_at)), np.float32)
        for i, record in enumerate(rows):
            row = first_row + i
            if len(record) != width:
                raise SparkInputError(
                    f"record {row}: expected {width} columns like the first, got {len(record)}"
                )
            features[i] = [_number(record[c], row, c) for c in features_at]
            if self.label_index is not None:
                labels[i, self.class_index(record[labels_at[0]], row, labels_at[0])] = 1.0
            else:
                labels[i] = [_number(record[c], row, c) for c in labels_at]
        return features, labels


@dataclass(frozen=True)
class _RecordsToDataSets:
    """Picklable partition function: records to DataSets of ``batch_size`` examples."""

    labels: _LabelSpec
    batch_size: int

    def __call__(self, records: Iterable[Record]) -> Iterator[DataSet]:
        first = 0
        for chunk in chunked(records, self.batch_size):
            yield DataSet(*self.labels.split(chunk, first))
            first += len(chunk)


def records_to_datasets(
    records: RDD | Iterable[Record],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    label_index: int | None = None,
    num_classes: int | None = None,
    label_range: tuple[int, int] | None = None,
    class_names: Sequence[str] | None = None,
) -> RDD | list[DataSet]:
    """Records to minibatch DataSets (DL4J's RecordReaderDataSetIterator).

    Classification: ``label_index`` (negative counts from the end) holds a class index in
    ``[0, num_classes)`` or, with ``class_names``, a class name; labels become one-hot float32.
    Regression: the columns ``label_range = (start, stop)`` (half-open) are the labels.
    Every other column is a feature (float32). Errors name the record (within its partition) and column.
    """
    spec = _LabelSpec.of(label_index, num_classes, label_range, class_names)
    convert = _RecordsToDataSets(spec, check_batch_size(batch_size))
    return convert_partitions(records, convert)


# --------------------------------------------------------------------------------------------------
# several record sources to MultiDataSets
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ColumnRange:
    """Columns ``[start, stop)`` of source ``source`` as one float32 array."""

    source: str
    start: int
    stop: int

    def width(self) -> int:
        return self.stop - self.start

    def values(self, record: Record, row: int) -> list[float]:
        if self.stop > len(record):
            raise SparkInputError(
                f"source {self.source!r}, record {row}: columns [{self.start}, {self.stop}) asked for, "
                f"record has {len(record)} columns"
            )
        return [_number(record[c], row, c) for c in range(self.start, self.stop)]


@dataclass(frozen=True)
class OneHotColumn:
    """Column ``column`` of source ``source``, a class index, as one-hot float32 of ``num_classes``."""

    source: str
    column: int
    num_classes: int

    def width(self) -> int:
        return self.num_classes

    def values(self, record: Record, row: int) -> list[float]:
        if self.column >= len(record):
            raise SparkInputError(
                f"source {self.source!r}, record {row}: column {self.column} asked for, record has "
                f"{len(record)} columns"
            )
        spec = _LabelSpec(0, self.num_classes)
        out = [0.0] * self.num_classes
        out[spec.class_index(record[self.column], row, self.column)] = 1.0
        return out


@dataclass
class MultiDataSetSpec:
    """Which columns of which named source make each input and output array (DL4J's
    RecordReaderMultiDataSetIterator builder). Column ranges are half-open ``[start, stop)``."""

    inputs: list[ColumnRange | OneHotColumn] = field(default_factory=list)
    outputs: list[ColumnRange | OneHotColumn] = field(default_factory=list)

    @staticmethod
    def _range(source: str, start: int, stop: int) -> ColumnRange:
        if not 0 <= start < stop:
            raise SparkConfigError(
                f"column range of {source!r}: expected 0 <= start < stop, got [{start}, {stop})"
            )
        return ColumnRange(str(source), int(start), int(stop))

    @staticmethod
    def _one_hot(source: str, column: int, num_classes: int) -> OneHotColumn:
        if column < 0 or num_classes < 1:
            raise SparkConfigError(
                f"one-hot column of {source!r}: expected column >= 0 and num_classes >= 1, got {column}, "
                f"{num_classes}"
            )
        return OneHotColumn(str(source), int(column), int(num_classes))

    def add_input(self, source: str, start: int, stop: int) -> MultiDataSetSpec:
        self.inputs.append(self._range(source, start, stop))
        return self

    def add_input_one_hot(self, source: str, column: int, num_classes: int) -> MultiDataSetSpec:
        self.inputs.append(self._one_hot(source, column, num_classes))
        return self

    def add_output(self, source: str, start: int, stop: int) -> MultiDataSetSpec:
        self.outputs.append(self._range(source, start, stop))
        return self

    def add_output_one_hot(self, source: str, column: int, num_classes: int) -> MultiDataSetSpec:
        self.outputs.append(self._one_hot(source, column, num_classes))
        return self

    def sources(self) -> set[str]:
        return {part.source for part in self.inputs + self.outputs}

    def convert(self, rows: Sequence[Mapping[str, Record]], first_row: int = 0) -> MultiDataSet:
        """Joined rows (source name -> record) to one MultiDataSet."""
        if not self.inputs:
            raise SparkConfigError("MultiDataSetSpec: add at least one input")

        def build(part: ColumnRange | OneHotColumn) -> np.ndarray:
            out = np.empty((len(rows), part.width()), np.float32)
            for i, row in enumerate(rows):
                out[i] = part.values(row[part.source], first_row + i)
            return out

        return MultiDataSet([build(p) for p in self.inputs], [build(p) for p in self.outputs])


@dataclass(frozen=True)
class _JoinedToMultiDataSets:
    spec: MultiDataSetSpec
    batch_size: int

    def __call__(self, rows: Iterable[Mapping[str, Record]]) -> Iterator[MultiDataSet]:
        first = 0
        for chunk in chunked(rows, self.batch_size):
            yield self.spec.convert(chunk, first)
            first += len(chunk)


def _sort_key(key: Any) -> tuple[str, Any]:
    return (type(key).__name__, key)


@dataclass(frozen=True)
class _Joiner:
    """One key's records from every source to a dict (or nothing, when dropping incomplete keys)."""

    names: tuple[str, ...]
    drop_missing: bool

    def __call__(self, item: tuple[Any, Iterable[tuple[str, Record]]]) -> list[dict[str, Record]]:
        key, tagged = item
        row: dict[str, Record] = {}
        for name, record in tagged:
            if name in row:
                raise SparkInputError(f"key {key!r} appears more than once in source {name!r}")
            row[name] = record
        missing = [n for n in self.names if n not in row]
        if missing:
            if self.drop_missing:
                return []
            raise SparkInputError(
                f"key {key!r} is missing from source(s) {missing} "
                "(pass drop_missing=True to drop such records)"
            )
        return [row]


@dataclass(frozen=True)
class _KeyBy:
    name: str
    column: int

    def __call__(self, record: Record) -> tuple[Any, tuple[str, Record]]:
        if self.column >= len(record):
            raise SparkInputError(
                f"source {self.name!r}: key column {self.column} asked for, record has {len(record)} columns"
            )
        return record[self.column], (self.name, record)


def _key_columns(names: Sequence[str], key_columns: int | Mapping[str, int] | None) -> dict[str, int] | None:
    if key_columns is None:
        return None
    if isinstance(key_columns, int):
        return dict.fromkeys(names, key_columns)
    missing = [n for n in names if n not in key_columns]
    if missing:
        raise SparkConfigError(f"key_columns: no key column given for source(s) {missing}")
    return {n: int(key_columns[n]) for n in names}


def records_to_multidatasets(
    sources: Mapping[str, RDD | Iterable[Record]],
    spec: MultiDataSetSpec,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    key_columns: int | Mapping[str, int] | None = None,
    drop_missing: bool = False,
    ordered: bool = False,
) -> RDD | list[MultiDataSet]:
    """Named record sources to MultiDataSets; with several sources, records are joined first.

    ``key_columns`` (one column for all sources, or per source) joins records with equal keys.
    Without it, records are joined by position (the i-th record of each source). A key missing from
    some source raises, unless ``drop_missing=True`` drops that record. Local results are ordered
    by key (or position); RDD results follow the shuffle unless ``ordered=True`` (one more sort).
    """
    if not isinstance(sources, Mapping) or not sources:
        raise SparkConfigError("sources: expected a non-empty mapping of source name -> records")
    names = tuple(str(n) for n in sources)
    unknown = spec.sources() - set(names)
    if unknown:
        raise SparkConfigError(f"MultiDataSetSpec uses source(s) {sorted(unknown)} not among {list(names)}")
    keys = _key_columns(names, key_columns)
    convert = _JoinedToMultiDataSets(spec, check_batch_size(batch_size))
    joiner = _Joiner(names, drop_missing)
    values = list(sources.values())
    if all(is_rdd(v) for v in values):
        if len(names) == 1 and keys is None:
            name = names[0]
            return values[0].map(lambda record: {name: record}).mapPartitions(convert)
        keyed = []
        for name, rdd in zip(names, values, strict=True):
            if keys is None:
                keyed.append(rdd.zipWithIndex().map(lambda pair, n=name: (pair[1], (n, pair[0]))))
            else:
                keyed.append(rdd.map(_KeyBy(name, keys[name])))
        context = values[0].context
        grouped = context.union(keyed).groupByKey()
        if ordered:
            grouped = grouped.sortBy(lambda kv: _sort_key(kv[0]))
        return grouped.flatMap(joiner).mapPartitions(convert)
    if any(is_rdd(v) for v in values):
        raise SparkConfigError("sources: expected all RDDs or all local iterables, not a mix")
    local = {name: list(v) for name, v in zip(names, values, strict=True)}
    if keys is None:
        lengths = {n: len(r) for n, r in local.items()}
        if len(set(lengths.values())) > 1 and not drop_missing:
            raise SparkInputError(f"joining by position needs sources of equal length, got {lengths}")
        grouped_local: dict[Any, list[tuple[str, Record]]] = {}
        for name, records in local.items():
            for i, record in enumerate(records):
                grouped_local.setdefault(i, []).append((name, record))
    else:
        grouped_local = {}
        for name, records in local.items():
            key_by = _KeyBy(name, keys[name])
            for record in records:
                key, tagged = key_by(record)
                grouped_local.setdefault(key, []).append(tagged)
    rows = [row for key in sorted(grouped_local, key=_sort_key) for row in joiner((key, grouped_local[key]))]
    return list(convert(rows))


__all__ = [
    "ColumnRange",
    "MultiDataSetSpec",
    "OneHotColumn",
    "csv_to_records",
    "parse_csv_line",
    "read_csv",
    "records_to_datasets",
    "records_to_multidatasets",
]
