"""Checkpoints of a multi-epoch fit: one atomic file per epoch, on a local path or any Hadoop-FS URI.

A checkpoint holds everything training continues from: the network in its file form (parameters,
updater state, counters, normaliser; a TorchNetwork with its optimizer state, user code by value),
the training master's encoding strategies (gradient sharing: the threshold algorithm and residual
post-processor, their classes by value and their states, so a user's own class resumes too), the epoch
and every epoch's metrics.
Files go through the storage layer (psrv.spark.storage): written to a temporary name and renamed where
the file system renames atomically (local, HDFS), so a reader never sees half a file; object stores
write the object directly (see README, storage).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
from psrv.encoding.errors import InvalidStateError
from psrv.nn.network import Network as LayerNetwork
from psrv.nn.protocol import TrainableNetwork
from psrv.nn.serialization import network_from_bytes, network_to_bytes
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark import storage, strategies
from psrv.spark.driver.master import TrainingMaster
from psrv.spark.errors import SparkConfigError, SparkInputError
from psrv.spark.payload import set_counters

if TYPE_CHECKING:
    from pyspark import SparkContext

FORMAT = "psrv.spark.checkpoint"
FORMAT_VERSION = 1
SUFFIX = ".psrvckpt"
_NAME = re.compile(r"checkpoint-(\d+)" + re.escape(SUFFIX) + "$")


@dataclass
class Checkpoint:
    path: str
    epoch: int
    history: list[tuple[int, dict[str, float]]]
    stopped: bool


def _network_bytes(network: TrainableNetwork) -> tuple[str, bytes]:
    if isinstance(network, LayerNetwork):
        return "network", network_to_bytes(network)
    from pyspark import cloudpickle

    return "torch", network.to_bytes(pickle_module=cloudpickle)


def network_from_record(kind: str, blob: bytes, source: str) -> TrainableNetwork:
    """The network a record's file form holds (``_network_bytes`` wrote it)."""
    if kind == "network":
        return network_from_bytes(blob, source=source)
    return TorchNetwork.from_bytes(blob, source=source)


def read_record(path: str, expected_format: str, what: str) -> dict[str, Any]:
    """One msgpack record file of ``expected_format`` (a checkpoint, a spark.ml model), or a clear error."""
    try:
        record = msgpack.unpackb(storage.read_bytes(path), raw=False)
    except (OSError, ValueError, msgpack.UnpackException) as exc:
        raise SparkInputError(f"{path}: not a readable {what}: {exc}") from exc
    if not isinstance(record, dict) or record.get("format") != expected_format:
        raise SparkInputError(f"{path}: not a {what} (expected format {expected_format!r})")
    return record


def _restore_network(kind: str, blob: bytes, network: TrainableNetwork, source: str) -> None:
    """Copy a checkpoint's network state into the driver's network object (in place)."""
    saved = network_from_record(kind, blob, source)
    if saved.params.shape != network.params.shape:
        raise SparkConfigError(
            f"{source}: the checkpoint holds {saved.params.size} parameters, the network "
            f"{network.params.size}: resume with the network the checkpoints were written for"
        )
    network.set_params(saved.params)
    network.set_updater_state(saved.updater_state)
    set_counters(network, int(saved.iteration), int(saved.epoch))
    if saved.normalizer is not None:
        network.normalizer = saved.normalizer


def _restore_strategies(record: dict[str, Any], master: TrainingMaster, source: str) -> None:
    """The master's threshold algorithm (and post-processor) as the checkpoint holds them: rebuilt with
    the classes it carries (a user's own too), or psrv's classes for a checkpoint without them."""
    try:
        if record.get("strategy_classes") and record.get("post_processor_state") is not None:
            threshold, processor = strategies.rebuild(
                record["strategy_classes"], [record["threshold_state"], record["post_processor_state"]],
                [strategies.THRESHOLD, strategies.POST_PROCESSOR])
            master.threshold_algorithm = threshold
            master.residual_post_processor = processor  # type: ignore[attr-defined]
        else:
            master.threshold_algorithm = strategies.rebuild(None, [record["threshold_state"]],
                                                            [strategies.THRESHOLD])[0]
    except InvalidStateError as exc:
        raise SparkInputError(f"{source}: the checkpoint's encoding strategies cannot be restored: {exc}") \
            from exc


def checkpoint_path(directory: str, epoch: int) -> str:
    return directory.rstrip("/") + "/" + f"checkpoint-{epoch:06d}{SUFFIX}"


def save(spark_context: SparkContext | None, directory: str, network: TrainableNetwork,
         master: TrainingMaster,
         epoch: int, history: list[tuple[int, dict[str, float]]], stopped: bool = False) -> str:
    """Write the checkpoint of ``epoch`` atomically; returns its path."""
    kind, blob = _network_bytes(network)
    threshold = master.threshold_algorithm
    record = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "epoch": int(epoch), "stopped": bool(stopped),
        "history": [[int(e), {k: float(v) for k, v in m.items()}] for e, m in history],
        "network_kind": kind, "network": blob,
        "threshold_state": threshold.get_state() if threshold is not None else None,
    }
    processor = getattr(master, "residual_post_processor", None)
    if threshold is not None and processor is not None:
        record["post_processor_state"] = processor.get_state()
        record["strategy_classes"] = strategies.classes_to_bytes([threshold, processor])
    data = msgpack.packb(record, use_bin_type=True)
    path = checkpoint_path(directory, epoch)
    if spark_context is not None and not storage.is_local(path):
        storage.use_hadoop_configuration(spark_context)
    storage.write_bytes(path, data)
    return path


def newest(spark_context: SparkContext | None, directory: str) -> str | None:
    """The path of the newest checkpoint in ``directory`` (None when it has none or does not exist)."""
    if not storage.is_dir(directory):
        return None
    paths = storage.list_files(directory, suffix=SUFFIX, recursive=False)
    numbered = [(int(m.group(1)), p) for p in paths if (m := _NAME.search(p))]
    return max(numbered)[1] if numbered else None


def load_newest(spark_context: SparkContext | None, directory: str, network: TrainableNetwork,
                master: TrainingMaster) -> Checkpoint | None:
    """Restore the newest checkpoint into ``network`` (and the master's threshold state)."""
    path = newest(spark_context, directory)
    if path is None:
        return None
    record = read_record(path, FORMAT, "psrv checkpoint")
    _restore_network(record["network_kind"], record["network"], network, path)
    if record.get("threshold_state") is not None and master.threshold_algorithm is not None:
        _restore_strategies(record, master, path)
    history = [(int(e), dict(m)) for e, m in record.get("history", [])]
    return Checkpoint(path, int(record["epoch"]), history, bool(record.get("stopped", False)))


__all__ = ["Checkpoint", "checkpoint_path", "load_newest", "newest", "save"]
