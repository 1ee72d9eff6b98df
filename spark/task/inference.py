"""The task side of distributed evaluation and inference: each partition evaluates or predicts with its
own copy of the network (built once per executor process from the broadcast payload)."""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.protocol import MultiIONetwork, TrainableNetwork, is_multi_io
from psrv.spark.data.batching import as_batch, chunked, rebatch
from psrv.spark.errors import SparkInputError
from psrv.spark.task.prefetch import PrefetchingIterator
from psrv.spark.task.worker import cached_network, path_loader, task_source

if TYPE_CHECKING:
    from pyspark import Broadcast


def _eval_batches(network: TrainableNetwork, batches: Iterable[Any], evaluations: list[Any]) -> list[Any]:
    # network.evaluate is what local evaluation runs, so distributed results equal local ones exactly
    # (it also widens a single sigmoid output to two classes for Evaluation).
    for batch in batches:
        for evaluation in evaluations:
            if isinstance(evaluation, MeanLoss):
                evaluation.eval_network(network, batch)
            else:
                network.evaluate(batch, evaluation, batch_size=max(1, batch.num_examples))
    return evaluations


class MeanLoss:
    """The network's mean loss per example (``network.score``) over the rows evaluated: merged like an
    evaluation, so one evaluation pass over validation data gives its loss too."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def eval_network(self, network: TrainableNetwork, batch: Any) -> None:
        rows = int(batch.num_examples)
        if rows and callable(getattr(network, "score", None)):
            self.total += float(network.score(batch, batch_size=rows)) * rows
            self.count += rows

    def merge(self, other: MeanLoss) -> None:
        self.total += other.total
        self.count += other.count

    def value(self) -> float:
        """The mean loss (NaN when no row was evaluated)."""
        return self.total / self.count if self.count else math.nan


def merge_lists(left: list[Any] | None, right: list[Any] | None) -> list[Any] | None:
    """Evaluations of two partitions merged pairwise (``left`` in place); None is the neutral element."""
    if left is None:
        return right
    if right is None:
        return left
    for mine, theirs in zip(left, right, strict=True):
        mine.merge(theirs)
    return left


class PartitionEvaluator:
    """What an evaluation job maps over the partitions (shipped with cloudpickle): every evaluation of
    ``templates`` over the partition, into copies."""

    def __init__(self, payload: Broadcast, templates: list[Any], batch_size: int, loader: Any | None,
                 prefetch: int) -> None:
        self.payload = payload
        self.templates = templates
        self.batch_size = batch_size
        self.loader = path_loader(loader)  # opens paths through psrv.spark.storage in the task
        self.prefetch = prefetch

    def __call__(self, items: Iterator[Any]) -> Iterator[list[Any]]:
        source = task_source(items, self.loader)
        if source is None:
            return
        network = cached_network(self.payload.value)
        # files are read ahead while the network evaluates; in-memory elements need no thread
        with PrefetchingIterator(source, self.prefetch if self.loader is not None else 0) as batches:
            yield _eval_batches(network, rebatch(batches, self.batch_size), copy.deepcopy(self.templates))


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


def _accepts_mask(network: TrainableNetwork) -> bool:
    try:
        return "mask" in inspect.signature(network.output).parameters
    except (TypeError, ValueError):
        return False


def masked_output(network: TrainableNetwork, features: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
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


def _feed_forward_several(network: MultiIONetwork, chunk: list[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
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


def _feed_forward_batch(network: TrainableNetwork, chunk: list[tuple[Any, Any]]) -> Iterator[tuple[Any,
                        np.ndarray]]:
    if is_multi_io(network):
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


class KeyedInference:
    """What ``feed_forward_with_key`` maps over the partitions: ``(key, prediction)`` per pair, in
    batches of ``batch_size``."""

    def __init__(self, payload: Broadcast, batch_size: int) -> None:
        self.payload = payload
        self.batch_size = batch_size

    def __call__(self, pairs: Iterator[tuple[Any, Any]]) -> Iterator[tuple[Any, np.ndarray]]:
        network = None
        for chunk in chunked(map(_checked_pair, pairs), self.batch_size):
            network = network or cached_network(self.payload.value)
            yield from _feed_forward_batch(network, chunk)


class OutputInference:
    """What ``outputs_of`` maps over the partitions: the network's output on each element's features."""

    def __init__(self, payload: Broadcast) -> None:
        self.payload = payload

    def __call__(self, items: Iterator[Any]) -> Iterator[Any]:
        network = None
        for item in items:
            batch = as_batch(item)
            network = network or cached_network(self.payload.value)
            yield network.output(batch.features)


__all__ = ["KeyedInference", "MeanLoss", "OutputInference", "PartitionEvaluator", "masked_output",
           "merge_lists"]
