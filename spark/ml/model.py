"""TorchModel: a trained psrv network as a ``pyspark.ml`` Transformer that saves and loads in a Pipeline.

``transform(df)`` adds the columns the output's kind calls for (psrv.nn.output_semantics: a class index and
a probability vector for classification, the value for regression) in one distributed pass, the network
broadcast once; the scoring itself runs in the tasks (``psrv.spark.task.prediction``).
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
from psrv.spark.ml.params import ModelParams, add_accessors, columns_of, set_from_keywords
from psrv.spark.ml.persistence import ModelReader, ModelWriter, model_record, read_model_file
from psrv.spark.ml.shapes import output_shape, single_prediction
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.prediction import ArrowPredictor, row_predictor
from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TorchModel", "check_columns", "is_classifier", "legacy_kind"]

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


def legacy_kind(network: TrainableNetwork) -> str:
    """The output kind of a model saved before models recorded it: what its activation implied then."""
    if not is_classifier(network):
        return "regression"
    return "binary" if int(network.num_outputs) == 1 else "multiclass"


def _arrow_transform(model: TorchModel, dataset: DataFrame, broadcast: Any, kind: str) -> Any:
    """``dataset`` with the prediction (and probability) columns computed by a scalar Arrow UDF (Spark 4.1+
    with pyarrow and pandas); None where that is not available, and the caller scores Spark's rows."""
    try:
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql.functions import ArrowUDFType, arrow_udf, col

        if not pyarrow_available():
            return None
        single = single_prediction(model.network, kind)
        schema = "prediction double" if single else "prediction array<double>"
        if kind != "regression":
            schema += ", probability array<double>"
        with warnings.catch_warnings():  # "type hints preferred": the UDF is a callable object, typed here
            warnings.simplefilter("ignore", UserWarning)
            predict = arrow_udf(ArrowPredictor(broadcast, model.feature_cols, kind), schema,
                                ArrowUDFType.SCALAR).asNondeterministic()  # evaluated once, not per field
        scored = dataset.withColumn(_SCORES, predict(*[col(c) for c in model.feature_cols]))
    except Exception as exc:  # noqa: BLE001 - an older Spark, no pandas ...: the row path
        log.info("TorchModel.transform scores Spark's rows, not Arrow batches (%s)", exc)
        return None
    scored = scored.withColumn(model.prediction_col, col(f"{_SCORES}.prediction"))
    if kind != "regression":
        scored = scored.withColumn(model.probability_col, array_to_vector(col(f"{_SCORES}.probability")))
    return scored.drop(_SCORES)


@add_accessors
class TorchModel(Model, ModelParams, MLWritable, MLReadable):
    """A trained psrv network as a ``pyspark.ml`` Transformer (also what ``NetworkEstimator`` returns).

    ``getModel()`` is the trained ``nn.Module`` (a ``psrv.nn.Network`` for ``NetworkEstimator``),
    ``history`` the fit's per-epoch metrics (training ``loss``, ``val_*``), ``network`` the psrv network.
    """

    # Spark ML records a stage's class by this dotted name (``PipelineModel.load`` imports it from there):
    # the package's name, so saved pipelines do not depend on which module defines the class.
    __module__ = "psrv.spark.ml"

    def __init__(self, network: TrainableNetwork, feature_cols: Sequence[str] | str | None = None,
                 prediction_col: str | None = None, probability_col: str | None = None, *,
                 output_kind: str | None = None, history: Sequence[dict[str, Any]] = (),
                 **params: Any) -> None:
        super().__init__()
        self.network = network
        set_from_keywords(self, {"feature_cols": feature_cols, "prediction_col": prediction_col,
                                 "probability_col": probability_col, "output_kind": output_kind, **params})
        self.history: list[dict[str, Any]] = [dict(r) for r in history]
        self.use_arrow = True  # False scores Spark's rows one by one (what transform did before Arrow)
        self.last_transform_path = ""  # "arrow" or "rows"

    @property
    def feature_cols(self) -> tuple[str, ...]:
        return columns_of(self.getOrDefault("featuresCol"))

    @property
    def prediction_col(self) -> str:
        return str(self.getOrDefault("predictionCol"))

    @property
    def probability_col(self) -> str:
        return str(self.getOrDefault("probabilityCol"))

    @property
    def output_kind(self) -> str:
        """multiclass, binary or regression (psrv.nn.output_semantics)."""
        kind = self.getOrDefault("outputKind")
        return legacy_kind(self.network) if kind == "auto" else str(kind)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """The module's output per example (``()``: one value). A regression prediction column holds it
        flattened in C order (a number for one value): ``np.reshape(row[prediction_col], output_shape)``.
        A classifier per position ((T, k), (C, H, W)) predicts one class per position: its prediction column
        is ``psrv.nn.torch_shapes.positions(output_shape)`` flattened ((T,), (H, W)), its probability column
        the output in this shape flattened."""
        return output_shape(self.network)

    @property
    def is_classifier(self) -> bool:
        return self.output_kind != "regression"

    def getModel(self) -> Any:  # noqa: N802 - pyspark's naming
        """The trained ``torch.nn.Module`` (for a psrv.nn network: the network itself)."""
        return getattr(self.network, "module", self.network)

    def copy(self, extra: Any = None) -> TorchModel:
        that = super().copy(extra)
        that.history = [dict(r) for r in self.history]
        return that

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

        check_columns(dataset, self.feature_cols, "featuresCol")
        session = dataset.sparkSession
        kind = self.output_kind
        fields = list(dataset.schema.fields)
        if single_prediction(self.network, kind):
            fields.append(StructField(self.prediction_col, DoubleType(), False))
        else:
            fields.append(StructField(self.prediction_col, ArrayType(DoubleType(), False), False))
        if kind != "regression":
            fields.append(StructField(self.probability_col, VectorUDT(), False))
        broadcast = session.sparkContext.broadcast(NetworkPayload.from_network(self.network))
        if self.use_arrow:
            scored = _arrow_transform(self, dataset, broadcast, kind)
            if scored is not None:
                self.last_transform_path = "arrow"
                return scored
        self.last_transform_path = "rows"
        rows = dataset.rdd.mapPartitions(row_predictor(broadcast, self.feature_cols, kind))
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
        return model_record(self.network, self.feature_cols, self.prediction_col, self.probability_col,
                            output_kind=self.output_kind, history=self.history)

    @classmethod
    def _from_record_file(cls, path: str) -> TorchModel:
        network, meta = read_model_file(path)
        return cls(network, feature_cols=list(meta["feature_cols"]), prediction_col=meta["prediction_col"],
                   probability_col=meta["probability_col"], output_kind=meta.get("output_kind"),
                   history=meta.get("history", ()))
