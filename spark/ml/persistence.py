"""TorchModel's files: a Spark ML stage directory (Spark's ``metadata/`` plus ``model.psrv``, the network in
its file form with the column names), or the single model file earlier versions wrote.

Spark's metadata goes through its DefaultParamsWriter (so ``PipelineModel.load`` finds the stage's class);
the network through psrv's storage layer, so a model also loads without Spark for local inference.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
from psrv.nn.protocol import TrainableNetwork
from psrv.spark import storage
from psrv.spark.driver.checkpoints import _network_bytes, network_from_record, read_record
from psrv.spark.errors import SparkInputError
from pyspark.ml.util import MLReader, MLWriter

__all__ = ["ESTIMATOR_FILE", "ESTIMATOR_FORMAT", "EstimatorReader", "EstimatorWriter", "FORMAT",
           "FORMAT_VERSION", "MODEL_FILE", "ModelReader", "ModelWriter", "model_record", "read_model_file"]

FORMAT = "psrv.spark.ml.model"
FORMAT_VERSION = 1
MODEL_FILE = "model.psrv"
ESTIMATOR_FORMAT = "psrv.spark.ml.estimator"
ESTIMATOR_FILE = "estimator.pkl"


def model_record(network: TrainableNetwork, feature_cols: Sequence[str], prediction_col: str,
                 probability_col: str, *, output_kind: str | None = None,
                 history: Sequence[dict[str, Any]] = ()) -> bytes:
    """The bytes of a model file: the network, the column names, the output's kind (how it predicts) and
    the fit's per-epoch metrics, one msgpack record."""
    kind, blob = _network_bytes(network)
    meta = {"feature_cols": list(feature_cols), "prediction_col": prediction_col,
            "probability_col": probability_col, "output_kind": output_kind, "history": list(history)}
    record = {"format": FORMAT, "format_version": FORMAT_VERSION, "network_kind": kind,
              "network": blob, "meta": json.dumps(meta)}
    return msgpack.packb(record, use_bin_type=True)


def read_model_file(path: str) -> tuple[TrainableNetwork, dict[str, Any]]:
    """The network and its metadata (``feature_cols``, ``prediction_col``, ``probability_col``; since the
    output kind was recorded also ``output_kind`` and ``history``)."""
    record = read_record(path, FORMAT, "psrv.spark.ml model file")
    network = network_from_record(record["network_kind"], record["network"], path)
    return network, json.loads(record["meta"])


class ModelWriter(MLWriter):
    """``metadata/`` through Spark's DefaultParamsWriter (one JSON line, via the Hadoop FS), the network
    through psrv's storage layer (atomic where the file system renames atomically)."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:  # noqa: N802 - pyspark's name
        from pyspark.ml.util import DefaultParamsWriter

        path = _qualified(path)
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata={"psrv_format": FORMAT, "psrv_file": MODEL_FILE})
        context = self.sparkSession.sparkContext
        if not storage.is_local(path):
            storage.use_hadoop_configuration(context)
        storage.write_bytes(storage.join(path, MODEL_FILE), self.instance._record())


class ModelReader(MLReader):
    """Reads what ``ModelWriter`` wrote, through the storage layer only (no Spark job needed, so a model
    loads for local inference too); keeps the saved uid, as pyspark's readers do. ``from_file`` builds
    the model from one model file (the model class's own constructor, given by the class)."""

    def __init__(self, from_file: Callable[[str], Any]) -> None:
        super().__init__()
        self.from_file = from_file

    def load(self, path: str) -> Any:
        path = _qualified(path)
        if not storage.is_dir(path):
            return self.from_file(path)
        metadata = _stage_metadata(path)
        model = self.from_file(storage.join(path, str(metadata.get("psrv_file", MODEL_FILE))))
        model._resetUid(metadata["uid"])
        return model


def _qualified(path: str) -> str:
    """A path without a scheme the way Spark resolves it (against ``fs.defaultFS``, e.g. ``hdfs://nn/...``
    on a cluster), so Spark's metadata and psrv's model file land side by side; without a running
    SparkContext, a local path."""
    text = str(path)
    if storage.scheme_of(text):
        return text
    context = storage._driver_context()
    if context is None:
        return storage.absolute(text)
    jvm = context._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(text)
    fs = hadoop_path.getFileSystem(context._jsc.hadoopConfiguration())
    return str(fs.makeQualified(hadoop_path).toString())


def _stage_metadata(path: str, expected: str = FORMAT, what: str = "TorchModel") -> dict[str, Any]:
    """Spark ML's ``metadata/part-*`` JSON line of a stage directory, checked to be psrv's ``expected``."""
    metadata_dir = storage.join(path, "metadata")
    parts = [p for p in storage.list_files(metadata_dir, recursive=False)
             if storage.basename(p).startswith("part-")] if storage.is_dir(metadata_dir) else []
    if not parts:
        raise SparkInputError(f"{path}: not a saved {what} (no {metadata_dir}/part-* metadata file)")
    line = storage.read_bytes(parts[0]).decode("utf-8").strip().splitlines()[0]
    metadata = json.loads(line)
    if metadata.get("psrv_format") != expected:
        raise SparkInputError(
            f"{path}: a Spark ML stage of class {metadata.get('class')!r}, not a psrv {what}")
    return metadata


class EstimatorWriter(MLWriter):
    """An unfitted estimator as a Spark ML stage directory: ``metadata/`` (class, uid and the Params that
    are plain values) through Spark's DefaultParamsWriter, and ``estimator.pkl``: what is code or objects
    (the module or network, loss, optimizer factory, training master, callbacks) by value, with
    cloudpickle, so classes defined in ``__main__`` or a notebook load elsewhere. Loggers are not saved
    (they hold open writers): give them again after loading."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:  # noqa: N802 - pyspark's name
        import pickle

        from pyspark import cloudpickle
        from pyspark.ml.util import DefaultParamsWriter

        path = _qualified(path)
        params = self.instance._json_params()
        try:
            blob = cloudpickle.dumps(self.instance._state(), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - whatever the user's objects raise
            raise SparkInputError(f"{type(self.instance).__name__}.save: its module, loss, optimizer "
                                  f"factory, training master or callbacks cannot be pickled: {exc}") from exc
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, paramMap=params,
                                         extraMetadata={"psrv_format": ESTIMATOR_FORMAT,
                                                        "psrv_file": ESTIMATOR_FILE})
        if not storage.is_local(path):
            storage.use_hadoop_configuration(self.sparkSession.sparkContext)
        storage.write_bytes(storage.join(path, ESTIMATOR_FILE), blob)


class EstimatorReader(MLReader):
    """Reads what ``EstimatorWriter`` wrote; ``build(state, params)`` makes the estimator of its class."""

    def __init__(self, build: Callable[[dict[str, Any], dict[str, Any]], Any]) -> None:
        super().__init__()
        self.build = build

    def load(self, path: str) -> Any:
        import pickle

        path = _qualified(path)
        metadata = _stage_metadata(path, ESTIMATOR_FORMAT, "estimator")
        state = pickle.loads(storage.read_bytes(storage.join(path, str(metadata["psrv_file"]))))
        estimator = self.build(state, dict(metadata.get("paramMap", {})))
        estimator._resetUid(metadata["uid"])
        return estimator
