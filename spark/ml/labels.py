"""The estimators' checks of a DataFrame's label column against what the loss needs, on the driver before
training starts: its type from the schema (no job), and for class labels one query for a value that is not
a class (the first such row located only when there is one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psrv.spark.data.parquet import parquet_files
from psrv.spark.errors import SparkInputError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["check_labels", "check_position_labels", "frame_kind", "position_label_problem"]


def frame_kind(frame: DataFrame) -> str:
    """What the DataFrame is, for messages: a Parquet scan or another DataFrame."""
    return "Parquet DataFrame" if parquet_files(frame) is not None else "DataFrame"


def _type_name(frame: DataFrame, column: str) -> str:
    return frame.schema[column].dataType.simpleString()


def check_labels(frame: DataFrame, label_col: str, kind: str, num_classes: int, what: str = "") -> None:
    """Refuse a label column the loss cannot take: text for any loss, and for ``multiclass`` / ``binary``
    anything but integral class indices in ``[0, num_classes)`` (binary: 0 and 1). ``what`` names the
    frame (e.g. "the validation DataFrame")."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, BooleanType, NumericType, StringType

    where = what or f"the {frame_kind(frame)}"
    data_type = frame.schema[label_col].dataType
    if isinstance(data_type, StringType):
        raise SparkInputError(
            f"label column {label_col!r} of {where} holds strings ({_type_name(frame, label_col)}); psrv "
            f"trains on numbers. Fix: index them first, e.g. StringIndexer(inputCol={label_col!r}, "
            "outputCol='label_index') as an earlier Pipeline stage, and labelCol='label_index'")
    if kind == "regression":
        if not isinstance(data_type, NumericType | ArrayType | VectorUDT | BooleanType):
            raise SparkInputError(
                f"label column {label_col!r} of {where}: expected numbers, arrays of numbers or ML Vectors "
                f"for a regression loss, got {_type_name(frame, label_col)}")
        return
    if not isinstance(data_type, NumericType | BooleanType):
        raise SparkInputError(
            f"label column {label_col!r} of {where}: expected one class index per row (a number) for a "
            f"{kind} loss, got {_type_name(frame, label_col)}")
    _check_class_values(frame, label_col, kind, num_classes, where)


def _check_class_values(frame: DataFrame, label_col: str, kind: str, num_classes: int, where: str) -> None:
    from pyspark.sql import functions as F

    value = F.col(label_col).cast("double")
    good = (value.isNotNull() & ~F.isnan(value) & (value == F.floor(value)) & (value >= 0)
            & (value < num_classes))
    bad = frame.select(label_col).where(~good | value.isNull()).limit(1).collect()
    if not bad:
        return
    row, found = _first_bad_row(frame, label_col, num_classes)
    expected = "0 or 1" if kind == "binary" else f"integral class indices in [0, {num_classes})"
    place = f"row {row} (0-based, in the DataFrame's order)" if row is not None else "a row"
    fix = ("Fix: map the labels to 0/1" if kind == "binary" else
           "Fix: index the classes 0..k-1 (StringIndexer does), or give the model one output per class")
    raise SparkInputError(
        f"label column {label_col!r} of {where}: {place} holds {found!r}; a {kind} loss needs {expected}. "
        f"{fix}")


def _first_bad_row(frame: DataFrame, label_col: str, num_classes: int) -> tuple[int | None, Any]:
    """(position, value) of the first label that is not a class index; a second job, on the error path."""
    import math

    def bad(pair: tuple[Any, int]) -> bool:
        value = pair[0][0]
        if value is None:
            return True
        number = float(value)
        return math.isnan(number) or number != math.floor(number) or not 0 <= number < num_classes

    found = frame.select(label_col).rdd.zipWithIndex().filter(bad).take(1)
    if not found:
        return None, None
    (row_value,), index = found[0]
    return int(index), row_value


def position_label_problem(value: Any, positions: int, num_classes: int) -> str | None:
    """What is wrong with one row's per-position label (None: nothing), for messages: its length, or the
    first position whose value is not an integral class index in ``[0, num_classes)`` (a row of
    ``positions * num_classes`` values: the first not a probability in [0, 1])."""
    import math

    if value is None:
        return "a null"
    values = list(value.toArray()) if hasattr(value, "toArray") else list(value)
    if len(values) == positions * num_classes:
        for at, v in enumerate(values):
            number = math.nan if v is None else float(v)
            if math.isnan(number) or not 0 <= number <= 1:
                return f"{v!r} at element {at} (not a probability in [0, 1])"
        return None
    if len(values) != positions:
        return f"{len(values)} values"
    for at, v in enumerate(values):
        number = math.nan if v is None else float(v)
        if math.isnan(number) or number != math.floor(number) or not 0 <= number < num_classes:
            return f"{v!r} at position {at}"
    return None


def check_position_labels(frame: DataFrame, label_col: str, positions: int, num_classes: int, shape: str,
                          what: str = "") -> None:
    """Refuse a label column a per-position classifier cannot take: anything but arrays (or ML Vectors) of
    ``positions`` integral class indices in ``[0, num_classes)``; its type from the schema, its values with
    one query for a bad row (``shape`` describes the module's output, for messages)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, NumericType

    where = what or f"the {frame_kind(frame)}"
    expected = (f"an array of {positions} class indices in [0, {num_classes}) per row (one per position of "
                f"the module's output {shape} without its class axis, flattened in C order), or of "
                f"{positions * num_classes} one-hot or probability values (the output's shape, flattened)")
    data_type = frame.schema[label_col].dataType
    is_vector = isinstance(data_type, VectorUDT)
    numbers = isinstance(data_type, ArrayType) and isinstance(data_type.elementType, NumericType)
    if not is_vector and not numbers:
        raise SparkInputError(
            f"label column {label_col!r} of {where} holds {_type_name(frame, label_col)}; a class loss per "
            f"position needs {expected}. Fix: build the column with F.array(...) or collect the positions' "
            "indices into one array per row")
    column = vector_to_array(F.col(label_col)) if is_vector else F.col(label_col)

    def bad_value(v: Any) -> Any:
        d = v.cast("double")
        return d.isNull() | F.isnan(d) | (d != F.floor(d)) | (d < 0) | (d >= num_classes)

    def bad_probability(v: Any) -> Any:
        d = v.cast("double")
        return d.isNull() | F.isnan(d) | (d < 0) | (d > 1)

    full = positions * num_classes
    size = F.size(column)
    bad = (column.isNull() | ((size != positions) & (size != full))
           | ((size == positions) & F.exists(column, bad_value))
           | ((size == full) & F.exists(column, bad_probability)))
    found = frame.select(F.col(label_col)).where(bad).limit(1).collect()
    if not found:
        return
    problem = position_label_problem(found[0][0], positions, num_classes)
    raise SparkInputError(
        f"label column {label_col!r} of {where}: a row holds {problem}; a class loss per position needs "
        f"{expected}. Fix: give every row one class index per position (pad or cut sequences to that "
        "length), or index the classes 0..k-1")
