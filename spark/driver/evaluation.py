"""Distributed evaluation and inference: each partition evaluates with its own copy of the network,
partial results are merged on the way back (tree-aggregated), and results save to JSON.

Evaluations given by the caller are templates: each task evaluates into a copy, the driver
returns new, merged objects and leaves the templates untouched.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.spark import storage
from psrv.spark.data.batching import check_batch_size, chunked, rebatch
from psrv.spark.errors import EvaluationFileError, SparkInputError, StorageError
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.prefetch import PrefetchingIterator
from psrv.spark.task.worker import path_loader, task_source

if TYPE_CHECKING:
    from pyspark import RDD, Broadcast, SparkContext

EVALUATION_FILE_FORMAT = "psrv-evaluations"
EVALUATION_FILE_VERSION = 1


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------
def _eval_batches(network: Any, batches: Iterable[Any], evaluations: list[Any]) -> list[Any]:
    # network.evaluate is what local evaluation runs, so distributed results equal local ones exactly
    # (it also widens a single sigmoid output to two classes for Evaluation).
    for batch in batches:
        for evaluation in evaluations:
            network.evaluate(batch, evaluation, batch_size=max(1, batch.num_examples))
    return evaluations


def _merge_lists(left: list[Any] | None, right: list[Any] | None) -> list[Any] | None:
    if left is None:
        return right
    if right is None:
        return left
    for mine, theirs in zip(left, right, strict=True):
        mine.merge(theirs)
    return left


def _partition_evaluator(
    payload: Broadcast, templates: list[Any], batch_size: int, loader: Any | None, prefetch: int
) -> Callable[[Iterator[Any]], Iterator[list[Any]]]:
    loader = path_loader(loader)  # opens paths through psrv.spark.storage in the task

    def evaluate(items: Iterator[Any]) -> Iterator[list[Any]]:
        source = task_source(items, loader)
        if source is None:
            return
        network = payload.value.cached_network()
        # files are read ahead while the network evaluates; in-memory elements need no thread
        with PrefetchingIterator(source, prefetch if loader is not None else 0) as batches:
            evaluated = _eval_batches(network, rebatch(batches, batch_size), copy.deepcopy(templates))
        yield evaluated

    return evaluate


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
        if not (hasattr(template, "eval") and hasattr(template, "merge")):
            raise SparkInputError(
                f"do_evaluation: expected evaluation objects with eval() and merge(), got "
                f"{type(template).__name__}"
            )
    broadcast = spark_context.broadcast(payload)
    try:
        merged = rdd.mapPartitions(
            _partition_evaluator(broadcast, templates, batch_size, loader, prefetch_num_batches)
        ).treeAggregate(None, _merge_lists, _merge_lists, depth=max(1, aggregation_depth))
    finally:
        broadcast.unpersist()
    return merged if merged is not None else copy.deepcopy(templates)


# --------------------------------------------------------------------------------------------------
# inference
# --------------------------------------------------------------------------------------------------
def _split_value(value: Any) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(value, tuple):
        if len(value) != 2:
            raise SparkInputError(
                f"feed_forward_with_key: expected values features or (features, mask), got a tuple of "
                f"{len(value)}"
            )
        features, mask = value
        return np.asarray(features), None if mask is None else np.asarray(mask)
    return np.asarray(value), None


def _accepts_mask(network: Any) -> bool:
    try:
        return "mask" in inspect.signature(network.output).parameters
    except (TypeError, ValueError):
        return False


def masked_output(network: Any, features: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The network's output; with a mask, masked-out examples (or steps) predict zeros.

    A network whose ``output`` takes a ``mask`` gets it; otherwise the mask is applied to the
    output's leading axes (per example ``(n,)`` or per step ``(n, t)``).
    """
    if mask is None:
        return network.output(features)
    if _accepts_mask(network):
        return network.output(features, mask=mask)
    output = np.array(network.output(features), copy=True)
    if mask.shape != output.shape[: mask.ndim]:
        raise SparkInputError(
            f"mask of shape {mask.shape} does not match the leading axes of the output {output.shape}"
        )
    return output * mask.reshape(mask.shape + (1,) * (output.ndim - mask.ndim)).astype(output.dtype)


def _feed_forward_several(network: Any, chunk: list[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    """A network of several inputs (values: a list of one array per input) or outputs (predictions: a
    list of one array per output); no masks."""
    count = len(network.input_shape) if network.multi_input else 1
    keys: list[Any] = []
    columns: list[list[np.ndarray]] = [[] for _ in range(count)]
    for key, value in chunk:
        parts = list(value) if network.multi_input and isinstance(value, list | tuple) else [value]
        if len(parts) != count or (not network.multi_input and isinstance(value, tuple)):
            raise SparkInputError(
                f"feed_forward_with_key: this network takes {count} input(s): expected values "
                f"{'a list of one array per input' if count > 1 else 'features (no mask)'}, got "
                f"{type(value).__name__}{f' of {len(value)}' if isinstance(value, list | tuple) else ''}")
        keys.append(key)
        for i, part in enumerate(parts):
            columns[i].append(np.asarray(part))
    outs = network.output([np.stack(c) for c in columns] if network.multi_input else np.stack(columns[0]))
    outs = outs if network.multi_output else [outs]
    for j, key in enumerate(keys):
        yield key, [out[j] for out in outs] if network.multi_output else outs[0][j]


def _feed_forward_batch(network: Any, chunk: list[tuple[Any, Any]]) -> Iterator[tuple[Any, np.ndarray]]:
    if getattr(network, "multi_input", False) or getattr(network, "multi_output", False):
        yield from _feed_forward_several(network, chunk)
        return
    keys, features, masks = [], [], []
    for key, value in chunk:
        x, m = _split_value(value)
        keys.append(key)
        features.append(x)
        masks.append(m)
    shapes = {x.shape for x in features}
    if len(shapes) != 1:
        raise SparkInputError(
            f"feed_forward_with_key: examples of different shapes in one batch: {sorted(shapes)}"
        )
    with_mask = [m is not None for m in masks]
    if any(with_mask) and not all(with_mask):
        # compute the two groups separately, keep the input order
        out: list[np.ndarray | None] = [None] * len(chunk)
        for flag in (False, True):
            index = [i for i, w in enumerate(with_mask) if w is flag]
            part = list(_feed_forward_batch(network, [chunk[i] for i in index]))
            for i, (_, prediction) in zip(index, part, strict=True):
                out[i] = prediction
        yield from zip(keys, out, strict=True)
        return
    batch = np.stack(features)
    mask = np.stack(masks) if all(with_mask) else None
    predictions = masked_output(network, batch, mask)
    for i, key in enumerate(keys):
        yield key, predictions[i]


def _checked_pair(pair: Any) -> tuple[Any, Any]:
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise SparkInputError(
            f"feed_forward_with_key: expected (key, value) pairs, got {type(pair).__name__}"
        )
    return pair


def feed_forward_with_key(spark_context: SparkContext, payload: NetworkPayload, pair_rdd: RDD,
                          batch_size: int) -> RDD:
    """``(key, prediction)`` for each ``(key, features)`` or ``(key, (features, mask))`` of one example.

    Lazy, like any RDD transformation: the network's broadcast lives as long as the result RDD
    may be recomputed.
    """
    check_batch_size(batch_size, "inference batch_size")
    broadcast = spark_context.broadcast(payload)

    def infer(pairs: Iterator[tuple[Any, Any]]) -> Iterator[tuple[Any, np.ndarray]]:
        network = None
        for chunk in chunked(map(_checked_pair, pairs), batch_size):
            network = network or broadcast.value.cached_network()
            yield from _feed_forward_batch(network, chunk)

    return pair_rdd.mapPartitions(infer, preservesPartitioning=True)


def outputs_of(spark_context: SparkContext, payload: NetworkPayload, rdd: RDD) -> RDD:
    """The network's output on each element's features (an RDD of DataSets or MultiDataSets, in order):
    an array, or a list of arrays (one per output) for a network of several outputs. Lazy."""
    from psrv.spark.data.batching import as_batch

    broadcast = spark_context.broadcast(payload)

    def infer(items: Iterator[Any]) -> Iterator[Any]:
        network = None
        for item in items:
            batch = as_batch(item)
            network = network or broadcast.value.cached_network()
            yield network.output(batch.features)

    return rdd.mapPartitions(infer, preservesPartitioning=True)


# --------------------------------------------------------------------------------------------------
# saving and loading results
# --------------------------------------------------------------------------------------------------
def _evaluation_classes() -> dict[str, type]:
    from psrv.nn import evaluation as module

    return {
        name: getattr(module, name)
        for name in ("Evaluation", "ROC", "ROCMultiClass", "RegressionEvaluation")
        if hasattr(module, name)
    }


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
