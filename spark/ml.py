"""psrv.spark.ml: Spark ML Estimators and Transformers around psrv networks (Horovod's TorchEstimator shape).

``TorchEstimator(module, loss, optimizer, input_shape, ...).fit(df)`` trains a ``TorchNetwork`` on Spark
(``SparkNetwork.fit`` with epochs, validation, callbacks and checkpoints) and returns a ``TorchModel``,
a Transformer whose ``transform(df)`` adds a prediction column (class index for classification, the value
for regression) and a probability column (classification) in one distributed pass, the network shipped
once per executor. ``NetworkEstimator`` does the same for a ``psrv.nn.Network``. Both are plain
``pyspark.ml`` stages, so they sit in a ``Pipeline`` (e.g. after a ``VectorAssembler``). Features may be
one array column, one ML Vector column, or several numeric / array / Vector columns (concatenated).
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import DataSet
from psrv.nn.network import Network as LayerNetwork
from psrv.nn.protocol import Network
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark import storage
from psrv.spark.config import VoidConfiguration
from psrv.spark.data.batching import chunked
from psrv.spark.data.inputs import _plan_hash
from psrv.spark.data.parquet import (
    ParquetColumns,
    _vectors,
    arrow_datasets,
    parquet_datasets,
    pyarrow_available,
)
from psrv.spark.driver.checkpoints import _network_bytes, network_from_record, read_record
from psrv.spark.driver.master import TrainingMaster
from psrv.spark.driver.network import SparkNetwork
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.errors import SparkConfigError, SparkInputError
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.worker import cached_network
from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

FORMAT = "psrv.spark.ml.model"
FORMAT_VERSION = 1
_ROWS = 256
_SCORES = "__psrv_scores"


def _values(value: Any, column: str) -> np.ndarray:
    if value is None:
        raise SparkInputError(f"column {column!r}: expected numbers, got a null")
    if hasattr(value, "toArray"):
        value = value.toArray()
    return np.asarray(value, dtype=np.float32).reshape(-1)


def _features(row: Any, columns: Sequence[str]) -> np.ndarray:
    parts = [_values(row[c], c) for c in columns]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _datasets(feature_cols: tuple[str, ...], label_col: str, num_classes: int | None) -> Any:
    def convert(rows: Iterator[Any]) -> Iterator[Any]:
        for chunk in chunked(rows, _ROWS):
            x = np.stack([_features(r, feature_cols) for r in chunk])
            labels = [_values(r[label_col], label_col) for r in chunk]
            if num_classes is not None:
                index = np.array([int(v[0]) for v in labels], dtype=np.int64)
                if index.min() < 0 or index.max() >= num_classes:
                    raise SparkInputError(
                        f"column {label_col!r}: expected class indices in [0, {num_classes}), got range "
                        f"[{int(index.min())}, {int(index.max())}]"
                    )
                y = np.eye(num_classes, dtype=np.float32)[index]
            else:
                y = np.stack(labels).astype(np.float32)
            yield DataSet(x, y)

    return convert


def _row_datasets(frame: DataFrame, feature_cols: tuple[str, ...], label_col: str,
                  classes: int | None) -> Any:
    """The fallback without pyarrow: Spark's rows, converted one by one in Python."""
    convert = _datasets(feature_cols, label_col, classes)
    return frame.select(*feature_cols, label_col).rdd.mapPartitions(convert)


def _check_columns(frame: DataFrame, columns: Sequence[str], option: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SparkInputError(
            f"DataFrame has no column(s) {missing} ({option}); its columns are {frame.columns}")


def _is_classifier(network: Network) -> bool:
    """Whether the network's output is class scores (softmax/sigmoid, or any loss but MSE)."""
    if isinstance(network, TorchNetwork):
        return network.output_activation in ("softmax", "sigmoid")
    if isinstance(network, LayerNetwork):
        return network.output_layer.loss.name != "mse"
    return True


class _NetworkEstimator(Estimator):
    """What both estimators share: turn the DataFrame into DataSets, fit over epochs, return a model."""

    def __init__(self, *, feature_cols: Sequence[str] | str, label_col: str, prediction_col: str,
                 probability_col: str, epochs: int, batch_size: int, training_master: TrainingMaster | None,
                 validation: Any, callbacks: Sequence[Any], checkpoint_dir: str | None) -> None:
        super().__init__()
        self.feature_cols = (feature_cols,) if isinstance(feature_cols, str) else tuple(feature_cols)
        if not self.feature_cols:
            raise SparkConfigError("feature_cols: expected at least one column name")
        self.label_col = label_col
        self.prediction_col = prediction_col
        self.probability_col = probability_col
        self.epochs = epochs
        self.batch_size = batch_size
        self.training_master = training_master
        self.validation = validation
        self.callbacks = tuple(callbacks)
        self.checkpoint_dir = checkpoint_dir
        self.last_history: list[Any] = []
        self.last_input_path = ""  # how the last fit read its DataFrame: "parquet", "arrow" or "rows"

    def _new_network(self) -> Network:
        raise NotImplementedError

    def _as_rdd(self, frame: DataFrame, network: Network) -> Any:
        """DataSets from the DataFrame, read as Arrow batches in the tasks: a plain Parquet scan by the
        tasks from its files, any other DataFrame through ``mapInArrow``; rows only without pyarrow."""
        _check_columns(frame, self.feature_cols, "feature_cols")
        _check_columns(frame, (self.label_col,), "label_col")
        if self.label_col in self.feature_cols:
            raise SparkConfigError(
                f"label_col {self.label_col!r} is also one of feature_cols {self.feature_cols}")
        classes = int(network.num_outputs) if _is_classifier(network) and network.num_outputs > 1 else None
        columns = ParquetColumns(self.feature_cols, self.label_col, classes)
        rdd, path = parquet_datasets(frame, columns, rows=_ROWS), "parquet"
        if rdd is None:
            rdd, path = arrow_datasets(frame, columns, rows=_ROWS), "arrow"
        if rdd is None:
            rdd, path = _row_datasets(frame, self.feature_cols, self.label_col, classes), "rows"
        rdd._psrv_source_key = ("ml", _plan_hash(frame), self.feature_cols, self.label_col, classes)
        self.last_input_path = path
        return rdd

    def _master(self) -> TrainingMaster:
        if self.training_master is not None:
            return self.training_master
        return SharedTrainingMaster(VoidConfiguration(), batch_size_per_worker=self.batch_size)

    def _fit(self, dataset: DataFrame) -> TorchModel:
        network = self._new_network()
        spark_net = SparkNetwork(dataset.sparkSession.sparkContext, network, self._master())
        validation = self._as_rdd(self.validation, network) if self.validation is not None else None
        spark_net.fit(self._as_rdd(dataset, network), epochs=self.epochs, validation_data=validation,
                      callbacks=self.callbacks, checkpoint_dir=self.checkpoint_dir)
        self.last_history = list(spark_net.history)
        return TorchModel(network, feature_cols=self.feature_cols, prediction_col=self.prediction_col,
                          probability_col=self.probability_col)


class TorchEstimator(_NetworkEstimator):
    """A ``pyspark.ml`` Estimator training a ``torch.nn.Module`` with psrv; ``fit(df) -> TorchModel``.

    Every ``fit`` starts from a copy of ``module`` as given. ``optimizer`` is a factory
    ``params -> torch.optim.Optimizer`` (default Adam(lr=1e-3)); ``training_master`` defaults to
    gradient sharing with ``batch_size`` examples per worker minibatch.
    """

    def __init__(self, module: Any, loss: Any, optimizer: Any = None, input_shape: Sequence[int] | int = (),
                 feature_cols: Sequence[str] | str = ("features",), label_col: str = "label",
                 prediction_col: str = "prediction", probability_col: str = "probability", epochs: int = 1,
                 batch_size: int = 32, training_master: TrainingMaster | None = None, validation: Any = None,
                 callbacks: Sequence[Any] = (), checkpoint_dir: str | None = None,
                 output_activation: str | None = "softmax", seed: int | None = None) -> None:
        super().__init__(feature_cols=feature_cols, label_col=label_col, prediction_col=prediction_col,
                         probability_col=probability_col, epochs=epochs, batch_size=batch_size,
                         training_master=training_master, validation=validation, callbacks=callbacks,
                         checkpoint_dir=checkpoint_dir)
        if not input_shape:
            raise SparkConfigError(
                "input_shape: expected the shape of one example, e.g. (64,) or (1, 28, 28)")
        self.module, self.loss, self.optimizer = module, loss, optimizer
        self.input_shape, self.output_activation, self.seed = input_shape, output_activation, seed

    def _new_network(self) -> Network:
        return TorchNetwork(copy.deepcopy(self.module), copy.deepcopy(self.loss), self.input_shape,
                            optimizer=self.optimizer, output_activation=self.output_activation,
                            seed=self.seed)


class NetworkEstimator(_NetworkEstimator):
    """The same for a ``psrv.nn.Network``: every ``fit`` trains a clone of ``network`` as given."""

    def __init__(self, network: LayerNetwork, feature_cols: Sequence[str] | str = ("features",),
                 label_col: str = "label", prediction_col: str = "prediction",
                 probability_col: str = "probability", epochs: int = 1, batch_size: int = 32,
                 training_master: TrainingMaster | None = None, validation: Any = None,
                 callbacks: Sequence[Any] = (), checkpoint_dir: str | None = None) -> None:
        super().__init__(feature_cols=feature_cols, label_col=label_col, prediction_col=prediction_col,
                         probability_col=probability_col, epochs=epochs, batch_size=batch_size,
                         training_master=training_master, validation=validation, callbacks=callbacks,
                         checkpoint_dir=checkpoint_dir)
        self.network = network

    def _new_network(self) -> Network:
        return self.network.clone()


def _predictor(broadcast: Any, feature_cols: tuple[str, ...], classifier: bool) -> Any:
    def predict(rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        from pyspark.ml.linalg import DenseVector

        network = cached_network(broadcast.value)  # built once per executor process
        for chunk in chunked(rows, _ROWS):
            out = np.asarray(network.output(np.stack([_features(r, feature_cols) for r in chunk])))
            for row, values in zip(chunk, out, strict=True):
                if classifier:
                    index = int(values[0] >= 0.5) if values.shape[0] == 1 else int(np.argmax(values))
                    yield (*row, float(index), DenseVector(values.astype(np.float64)))
                else:
                    yield (*row, float(values[0]) if values.shape[0] == 1 else [float(v) for v in values])

    return predict


@dataclass(frozen=True)
class _ArrowPredictor:
    """Task side of the scalar Arrow UDF ``transform`` uses: the feature columns' Arrow arrays of one batch
    to the network's outputs, column-wise (the network built once per executor process)."""

    broadcast: Any
    feature_cols: tuple[str, ...]
    classifier: bool

    def __call__(self, *arrays: Any) -> Any:
        import pyarrow as pa

        parts = [_vectors(a, name) for a, name in zip(arrays, self.feature_cols, strict=True)]
        x = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        network = cached_network(self.broadcast.value)
        out = np.asarray(network.output(x), dtype=np.float64).reshape(len(x), -1)
        outputs = out.shape[1]

        def lists(values: np.ndarray) -> Any:
            offsets = pa.array(np.arange(0, values.size + 1, outputs, dtype=np.int32))
            return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))

        if self.classifier:
            index = (out[:, 0] >= 0.5) if outputs == 1 else np.argmax(out, axis=1)
            return pa.StructArray.from_arrays([pa.array(index.astype(np.float64)), lists(out)],
                                              names=["prediction", "probability"])
        prediction = pa.array(out[:, 0]) if outputs == 1 else lists(out)
        return pa.StructArray.from_arrays([prediction], names=["prediction"])


def _arrow_transform(model: TorchModel, dataset: DataFrame, broadcast: Any, classifier: bool) -> Any:
    """``dataset`` with the prediction (and probability) columns computed by a scalar Arrow UDF (Spark 4.1+
    with pyarrow and pandas); None where that is not available, and the caller scores Spark's rows."""
    try:
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql.functions import ArrowUDFType, arrow_udf, col

        if not pyarrow_available():
            return None
        outputs = int(model.network.num_outputs)
        if classifier:
            schema = "prediction double, probability array<double>"
        else:
            schema = "prediction double" if outputs == 1 else "prediction array<double>"
        with warnings.catch_warnings():  # "type hints preferred": the UDF is a callable object, typed here
            warnings.simplefilter("ignore", UserWarning)
            predict = arrow_udf(_ArrowPredictor(broadcast, model.feature_cols, classifier), schema,
                                ArrowUDFType.SCALAR).asNondeterministic()  # evaluated once, not per field
        scored = dataset.withColumn(_SCORES, predict(*[col(c) for c in model.feature_cols]))
    except Exception as exc:  # noqa: BLE001 - an older Spark, no pandas ...: the row path
        log.info("TorchModel.transform scores Spark's rows, not Arrow batches (%s)", exc)
        return None
    scored = scored.withColumn(model.prediction_col, col(f"{_SCORES}.prediction"))
    if classifier:
        scored = scored.withColumn(model.probability_col, array_to_vector(col(f"{_SCORES}.probability")))
    return scored.drop(_SCORES)


class TorchModel(Model, MLWritable, MLReadable):
    """A trained psrv network as a ``pyspark.ml`` Transformer (also what ``NetworkEstimator`` returns)."""

    def __init__(self, network: Network, feature_cols: Sequence[str] | str = ("features",),
                 prediction_col: str = "prediction", probability_col: str = "probability") -> None:
        super().__init__()
        self.network = network
        self.feature_cols = (feature_cols,) if isinstance(feature_cols, str) else tuple(feature_cols)
        self.prediction_col = prediction_col
        self.probability_col = probability_col
        self.use_arrow = True  # False scores Spark's rows one by one (what transform did before Arrow)
        self.last_transform_path = ""  # "arrow" or "rows"

    @property
    def is_classifier(self) -> bool:
        return _is_classifier(self.network)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

        _check_columns(dataset, self.feature_cols, "feature_cols")
        session = dataset.sparkSession
        classifier = self.is_classifier
        fields = list(dataset.schema.fields)
        if classifier:
            fields += [StructField(self.prediction_col, DoubleType(), False),
                       StructField(self.probability_col, VectorUDT(), False)]
        elif int(self.network.num_outputs) == 1:
            fields.append(StructField(self.prediction_col, DoubleType(), False))
        else:
            fields.append(StructField(self.prediction_col, ArrayType(DoubleType(), False), False))
        broadcast = session.sparkContext.broadcast(NetworkPayload.from_network(self.network))
        if self.use_arrow:
            scored = _arrow_transform(self, dataset, broadcast, classifier)
            if scored is not None:
                self.last_transform_path = "arrow"
                return scored
        self.last_transform_path = "rows"
        rows = dataset.rdd.mapPartitions(_predictor(broadcast, self.feature_cols, classifier))
        return session.createDataFrame(rows, StructType(fields))

    # -- files (pyspark.ml's MLWritable / MLReadable, so a PipelineModel holding it saves and loads) ---
    def write(self) -> _TorchModelWriter:
        return _TorchModelWriter(self)

    def save(self, path: str) -> None:
        """A Spark ML stage directory (local path or Hadoop-FS URI): Spark's ``metadata/`` (class, uid;
        what ``PipelineModel.load`` reads to find this class) and ``model.psrv``, the network in its file
        form with the column names, written through psrv's storage layer."""
        self.write().save(path)

    @classmethod
    def read(cls) -> _TorchModelReader:
        return _TorchModelReader()

    @classmethod
    def load(cls, path: str) -> TorchModel:
        """A directory ``save`` wrote (also what ``PipelineModel.load`` calls for this stage), or a single
        model file an earlier ``TorchModel.save`` wrote (before the directory layout)."""
        return cls.read().load(path)

    def _record(self) -> bytes:
        import msgpack

        kind, blob = _network_bytes(self.network)
        meta = {"feature_cols": list(self.feature_cols), "prediction_col": self.prediction_col,
                "probability_col": self.probability_col}
        record = {"format": FORMAT, "format_version": FORMAT_VERSION, "network_kind": kind,
                  "network": blob, "meta": json.dumps(meta)}
        return msgpack.packb(record, use_bin_type=True)

    @classmethod
    def _from_record_file(cls, path: str) -> TorchModel:

        record = read_record(path, FORMAT, "psrv.spark.ml model file")
        network = network_from_record(record["network_kind"], record["network"], path)
        meta = json.loads(record["meta"])
        return cls(network, feature_cols=meta["feature_cols"], prediction_col=meta["prediction_col"],
                   probability_col=meta["probability_col"])


MODEL_FILE = "model.psrv"


class _TorchModelWriter(MLWriter):
    """``metadata/`` through Spark's DefaultParamsWriter (one JSON line, via the Hadoop FS), the network
    through psrv's storage layer (atomic where the file system renames atomically)."""

    def __init__(self, instance: TorchModel) -> None:
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


class _TorchModelReader(MLReader):
    """Reads what ``_TorchModelWriter`` wrote, through the storage layer only (no Spark job needed, so a
    model loads for local inference too); keeps the saved uid, as pyspark's readers do."""

    def load(self, path: str) -> TorchModel:
        path = _qualified(path)
        if not storage.is_dir(path):
            return TorchModel._from_record_file(path)
        metadata = _stage_metadata(path)
        model = TorchModel._from_record_file(storage.join(path, str(metadata.get("psrv_file", MODEL_FILE))))
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


def _stage_metadata(path: str) -> dict[str, Any]:
    """Spark ML's ``metadata/part-*`` JSON line of a stage directory, checked to name TorchModel."""
    metadata_dir = storage.join(path, "metadata")
    parts = [p for p in storage.list_files(metadata_dir, recursive=False)
             if storage.basename(p).startswith("part-")] if storage.is_dir(metadata_dir) else []
    if not parts:
        raise SparkInputError(f"{path}: not a saved TorchModel (no {metadata_dir}/part-* metadata file)")
    line = storage.read_bytes(parts[0]).decode("utf-8").strip().splitlines()[0]
    metadata = json.loads(line)
    if metadata.get("psrv_format") != FORMAT:
        raise SparkInputError(
            f"{path}: a Spark ML stage of class {metadata.get('class')!r}, not a psrv TorchModel")
    return metadata


__all__ = ["NetworkEstimator", "TorchEstimator", "TorchModel"]
