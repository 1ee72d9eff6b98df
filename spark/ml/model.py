"""TorchModel: a trained psrv network as a ``pyspark.ml`` Transformer that saves and loads in a Pipeline.

``transform(df)`` adds a prediction column (class index for classification, the value for regression) and
a probability column (classification) in one distributed pass, the network broadcast once; the scoring
itself runs in the tasks (``psrv.spark.task.prediction``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psrv.nn.network import Network as LayerNetwork
from psrv.nn.protocol import TrainableNetwork
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark.data.parquet import pyarrow_available
from psrv.spark.errors import SparkInputError
from psrv.spark.ml.persistence import ModelReader, ModelWriter, model_record, read_model_file
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.prediction import ArrowPredictor, row_predictor
from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TorchModel", "check_columns", "is_classifier"]

log = logging.getLogger(__name__)

_SCORES = "__psrv_scores"


def check_columns(frame: DataFrame, columns: Sequence[str], option: str) -> None:
    """Refuse a DataFrame without the named columns, listing what it has."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SparkInputError(
            f"DataFrame has no column(s) {missing} ({option}); its columns are {frame.columns}")


def is_classifier(network: TrainableNetwork) -> bool:
    """Whether the network's output is class scores (softmax/sigmoid, or any loss but MSE)."""
    if isinstance(network, TorchNetwork):
        return network.output_activation in ("softmax", "sigmoid")
    if isinstance(network, LayerNetwork):
        return network.output_layer.loss.name != "mse"
    return True


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
            predict = arrow_udf(ArrowPredictor(broadcast, model.feature_cols, classifier), schema,
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

    # Spark ML records a stage's class by this dotted name (``PipelineModel.load`` imports it from there):
    # the package's name, so saved pipelines do not depend on which module defines the class.
    __module__ = "psrv.spark.ml"

    def __init__(self, network: TrainableNetwork, feature_cols: Sequence[str] | str = ("features",),
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
        return is_classifier(self.network)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

        check_columns(dataset, self.feature_cols, "feature_cols")
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
        rows = dataset.rdd.mapPartitions(row_predictor(broadcast, self.feature_cols, classifier))
        return session.createDataFrame(rows, StructType(fields))

    # -- files (pyspark.ml's MLWritable / MLReadable, so a PipelineModel holding it saves and loads) ---
    def write(self) -> ModelWriter:
        return ModelWriter(self)

    def save(self, path: str) -> None:
        """A Spark ML stage directory (local path or Hadoop-FS URI): Spark's ``metadata/`` (class, uid;
        what ``PipelineModel.load`` reads to find this class) and ``model.psrv``, the network in its file
        form with the column names, written through psrv's storage layer."""
        self.write().save(path)

    @classmethod
    def read(cls) -> ModelReader:
        return ModelReader(cls._from_record_file)

    @classmethod
    def load(cls, path: str) -> TorchModel:
        """A directory ``save`` wrote (also what ``PipelineModel.load`` calls for this stage), or a single
        model file an earlier ``TorchModel.save`` wrote (before the directory layout)."""
        return cls.read().load(path)

    def _record(self) -> bytes:
        return model_record(self.network, self.feature_cols, self.prediction_col, self.probability_col)

    @classmethod
    def _from_record_file(cls, path: str) -> TorchModel:
        network, meta = read_model_file(path)
        return cls(network, feature_cols=meta["feature_cols"], prediction_col=meta["prediction_col"],
                   probability_col=meta["probability_col"])
