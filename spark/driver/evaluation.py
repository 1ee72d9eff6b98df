"""Distributed evaluation and inference: each partition evaluates with its own copy of the network,
partial results are merged on the way back (tree-aggregated), and results save to JSON.

Evaluations given by the caller are templates: each task evaluates into a copy, the driver
returns new, merged objects and leaves the templates untouched.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psrv.nn import evaluation as module
from psrv.spark import storage
from psrv.spark.data.batching import check_batch_size
from psrv.spark.errors import EvaluationFileError, SparkInputError, StorageError
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.inference import KeyedInference, OutputInference, PartitionEvaluator, merge_lists

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

EVALUATION_FILE_FORMAT = "psrv-evaluations"
EVALUATION_FILE_VERSION = 1


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------
def do_evaluation(
    spark_context: SparkContext,
    payload: NetworkPayload,
    rdd: RDD,
    batch_size: int,
    evaluations: Sequence[Any],
    *,
    loader: Any | None = None,
    prefetch_num_batches: int = 2,
    aggregation_depth: int = 2,
) -> list[Any]:
    """Run every evaluation over ``rdd`` in one pass; returns new merged evaluations, in order.

    ``rdd`` holds DataSets, or paths when ``loader`` is given (``loader.load(path) -> DataSet``).
    """
    check_batch_size(batch_size, "eval batch_size")
    templates = list(evaluations)
    if not templates:
        raise SparkInputError("do_evaluation: expected at least one evaluation object, got none")
    for template in templates:
        scores = hasattr(template, "eval") or hasattr(template, "eval_network")  # MeanLoss: the latter
        if not (scores and hasattr(template, "merge")):
            raise SparkInputError(
                f"do_evaluation: expected evaluation objects with eval() and merge(), got "
                f"{type(template).__name__}"
            )
    broadcast = spark_context.broadcast(payload)
    try:
        merged = rdd.mapPartitions(
            PartitionEvaluator(broadcast, templates, batch_size, loader, prefetch_num_batches)
        ).treeAggregate(None, merge_lists, merge_lists, depth=max(1, aggregation_depth))
    finally:
        broadcast.unpersist()
    return merged if merged is not None else copy.deepcopy(templates)


# --------------------------------------------------------------------------------------------------
# inference
# --------------------------------------------------------------------------------------------------
def feed_forward_with_key(spark_context: SparkContext, payload: NetworkPayload, pair_rdd: RDD,
                          batch_size: int) -> RDD:
    """``(key, prediction)`` for each ``(key, features)`` or ``(key, (features, mask))`` of one example.

    Lazy, like any RDD transformation: the network's broadcast lives as long as the result RDD
    may be recomputed.
    """
    check_batch_size(batch_size, "inference batch_size")
    broadcast = spark_context.broadcast(payload)
    return pair_rdd.mapPartitions(KeyedInference(broadcast, batch_size), preservesPartitioning=True)


def outputs_of(spark_context: SparkContext, payload: NetworkPayload, rdd: RDD) -> RDD:
    """The network's output on each element's features (an RDD of DataSets or MultiDataSets, in order):
    an array, or a list of arrays (one per output) for a network of several outputs. Lazy."""
    broadcast = spark_context.broadcast(payload)
    return rdd.mapPartitions(OutputInference(broadcast), preservesPartitioning=True)


# --------------------------------------------------------------------------------------------------
# saving and loading results
# --------------------------------------------------------------------------------------------------
def _evaluation_classes() -> dict[str, type]:
    return {name: getattr(module, name) for name in module.__all__ if isinstance(getattr(module, name), type)}


def evaluations_to_json(evaluations: Sequence[Any]) -> str:
    items = [{"type": type(e).__name__, "json": json.loads(e.to_json())} for e in evaluations]
    document = {"format": EVALUATION_FILE_FORMAT, "version": EVALUATION_FILE_VERSION, "evaluations": items}
    return json.dumps(document)


def evaluations_from_json(text: str, source: str = "<text>") -> list[Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvaluationFileError(f"{source}: not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != EVALUATION_FILE_FORMAT:
        raise EvaluationFileError(f"{source}: not a {EVALUATION_FILE_FORMAT} file")
    if document.get("version") != EVALUATION_FILE_VERSION:
        raise EvaluationFileError(
            f"{source}: version {document.get('version')!r}, "
            f"this psrv reads version {EVALUATION_FILE_VERSION}"
        )
    classes = _evaluation_classes()
    result = []
    for i, item in enumerate(document.get("evaluations", [])):
        cls = classes.get(item.get("type")) if isinstance(item, dict) else None
        if cls is None:
            raise EvaluationFileError(f"{source}: evaluation {i} has unknown type {item!r:.80}")
        result.append(cls.from_json(json.dumps(item["json"])))
    return result


def write_text(path: str, text: str, spark_context: SparkContext | None = None) -> None:
    """Write ``text`` atomically to a local path or any storage-layer URI (``spark_context`` adds the
    cluster's Hadoop settings)."""
    if spark_context is not None:
        storage.use_hadoop_configuration(spark_context)
    storage.write_bytes(path, text.encode("utf-8"))


def read_text(path: str, spark_context: SparkContext | None = None) -> str:
    if spark_context is not None:
        storage.use_hadoop_configuration(spark_context)
    try:
        return storage.read_bytes(path).decode("utf-8")
    except StorageError as exc:
        raise EvaluationFileError(str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise EvaluationFileError(f"{path}: not UTF-8 text ({exc})") from exc


def save_evaluations(
    evaluations: Sequence[Any] | Any, path: str, spark_context: SparkContext | None = None
) -> None:
    """Save one or several evaluation results as one JSON file (local path or Spark file system URI)."""
    items = list(evaluations) if isinstance(evaluations, list | tuple) else [evaluations]
    write_text(path, evaluations_to_json(items), spark_context)


def load_evaluations(path: str, spark_context: SparkContext | None = None) -> list[Any]:
    """Read back what :func:`save_evaluations` wrote (always a list)."""
    return evaluations_from_json(read_text(path, spark_context), path)


__all__ = [
    "EVALUATION_FILE_FORMAT", "EVALUATION_FILE_VERSION", "do_evaluation", "evaluations_from_json",
    "evaluations_to_json", "feed_forward_with_key", "load_evaluations", "outputs_of", "read_text",
    "save_evaluations", "write_text",
]
