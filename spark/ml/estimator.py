"""TorchEstimator and NetworkEstimator: ``pyspark.ml`` Estimators that train a psrv network on Spark.

``fit(df)`` checks the columns and labels against what the loss needs (on the driver, before training),
holds out the validation rows, turns the DataFrame into DataSets (Arrow batches read in the tasks,
Spark's rows without pyarrow), trains with ``SparkNetwork.fit`` (epochs, callbacks, checkpoints, resume)
and returns a ``TorchModel`` that predicts what the loss trained for (psrv.nn.output_semantics). Their
settings are Spark ML Params (psrv.spark.ml.params), so tuning tools and ``fit(df, paramMap)`` work.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psrv.nn.network import Network as LayerNetwork
from psrv.nn.output_semantics import OutputSemantics, check_outputs, for_loss_name, for_torch_loss
from psrv.nn.protocol import TrainableNetwork
from psrv.nn.torch_adapter import TorchNetwork
from psrv.nn.updaters import schedule_from_config
from psrv.spark.config import VoidConfiguration
from psrv.spark.data.inputs import _plan_hash
from psrv.spark.data.parquet import ParquetColumns, arrow_datasets, parquet_datasets
from psrv.spark.driver.master import TrainingMaster
from psrv.spark.driver.network import SparkNetwork
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.errors import SparkConfigError
from psrv.spark.ml.labels import check_labels, check_position_labels
from psrv.spark.ml.model import TorchModel, check_columns
from psrv.spark.ml.params import EstimatorParams, add_accessors, columns_of, set_from_keywords
from psrv.spark.ml.persistence import EstimatorReader, EstimatorWriter
from psrv.spark.ml.shapes import check_dataframe_shapes, label_positions, output_shape, per_position_classes
from psrv.spark.ml.validation import EpochEnd, split_validation, validation_metrics
from psrv.spark.task.inference import MeanLoss
from psrv.spark.task.row_datasets import CHUNK_ROWS, row_converter
from pyspark.ml import Estimator
from pyspark.ml.util import MLReadable, MLWritable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["LearningRate", "NetworkEstimator", "TorchEstimator"]


def _row_datasets(frame: DataFrame, columns: ParquetColumns) -> Any:
    """The fallback without pyarrow: Spark's rows, converted one by one in Python."""
    convert = row_converter(columns.feature_names, columns.label_col, columns.num_classes, columns.binary,
                            columns.positions, columns.classes_last)
    feature_cols, label_col = columns.feature_names, columns.label_col
    return frame.select(*feature_cols, label_col).rdd.mapPartitions(convert)


@dataclasses.dataclass(frozen=True)
class LearningRate:
    """An optimizer factory with the ``learningRate`` Param applied to every parameter group (a module-level
    class, so it travels by reference)."""

    factory: Any
    lr: float

    def __call__(self, params: Any) -> Any:
        import torch

        built = self.factory(params) if self.factory is not None else torch.optim.Adam(params)
        if "lr" not in built.defaults:
            raise SparkConfigError(f"learningRate: the optimizer {type(built).__name__} takes no learning "
                                   "rate; leave learningRate unset")
        built.defaults["lr"] = self.lr
        for group in built.param_groups:
            group["lr"] = self.lr
        return built


class _NetworkEstimator(Estimator, EstimatorParams, MLWritable, MLReadable):
    """What both estimators share: check, split, turn the DataFrame into DataSets, fit, return a model."""

    __module__ = "psrv.spark.ml"  # what saved pipelines record (the package imports it from there)

    def __init__(self, *, training_master: TrainingMaster | None, callbacks: Sequence[Any], loggers: Any,
                 keywords: dict[str, Any]) -> None:
        super().__init__()
        set_from_keywords(self, keywords)
        if not self.feature_cols:
            raise SparkConfigError("feature_cols: expected at least one column name")
        self.training_master = training_master
        self.callbacks = tuple(callbacks)
        self.loggers = loggers
        self.last_history: list[dict[str, Any]] = []
        self.last_input_path = ""  # how the last fit read its DataFrame: "parquet", "arrow" or "rows"

    # -- the Params as Python values ------------------------------------------------------------------
    @property
    def feature_cols(self) -> tuple[str, ...]:
        return columns_of(self.getOrDefault("featuresCol"))

    @property
    def label_col(self) -> str:
        return str(self.getOrDefault("labelCol"))

    def _optional(self, name: str) -> Any:
        return self.getOrDefault(name) if self.isDefined(name) else None

    def setParams(self, **params: Any) -> _NetworkEstimator:  # noqa: N802 - pyspark's naming
        """Set Params by their names (``epochs=3``) or the constructor's keywords (``batch_size=64``)."""
        set_from_keywords(self, params)
        return self

    # -- what each estimator defines ----------------------------------------------------------------
    def _new_network(self) -> TrainableNetwork:
        raise NotImplementedError

    def _semantics(self, network: TrainableNetwork) -> OutputSemantics:
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    # -- data ---------------------------------------------------------------------------------------
    def _as_rdd(self, frame: DataFrame, semantics: OutputSemantics, outputs: int,
                per_position: tuple[int, int, bool] | None = None) -> Any:
        """DataSets from the DataFrame, read as Arrow batches in the tasks: a plain Parquet scan by the
        tasks from its files, any other DataFrame through ``mapInArrow``; rows only without pyarrow.
        ``per_position``: (positions, classes, classes_last) of a per-position classifier's labels."""
        classes = outputs if semantics.kind == "multiclass" else None
        binary = semantics.kind == "binary" and outputs == 1
        columns = ParquetColumns(self.feature_cols, self.label_col, classes, binary=binary)
        if per_position is not None:
            positions, classes, last = per_position
            columns = dataclasses.replace(columns, num_classes=classes, positions=positions,
                                          classes_last=last)
        rdd, path = parquet_datasets(frame, columns, rows=CHUNK_ROWS), "parquet"
        if rdd is None:
            rdd = arrow_datasets(frame, dataclasses.replace(columns, source="DataFrame"), rows=CHUNK_ROWS)
            path = "arrow"
        if rdd is None:
            rdd, path = _row_datasets(frame, columns), "rows"
        rdd._psrv_source_key = ("ml", _plan_hash(frame), self.feature_cols, self.label_col, classes, binary,
                                per_position)
        self.last_input_path = path
        return rdd

    def _check_frame(self, frame: DataFrame, semantics: OutputSemantics, outputs: int,
                     what: str = "", per_position: tuple[int, int, bool] | None = None,
                     shape: tuple[int, ...] = ()) -> None:
        check_columns(frame, self.feature_cols, "featuresCol")
        check_columns(frame, (self.label_col,), "labelCol")
        if self.label_col in self.feature_cols:
            raise SparkConfigError(
                f"labelCol {self.label_col!r} is also one of featuresCol {self.feature_cols}")
        if per_position is not None:
            described = "(" + ", ".join(str(d) for d in ("n", *shape)) + ")"
            check_position_labels(frame, self.label_col, per_position[0], per_position[1], described, what)
            return
        kind = semantics.kind if semantics.kind == "multiclass" or outputs == 1 else "regression"
        check_labels(frame, self.label_col, kind, outputs if kind == "multiclass" else 2, what)

    def _master(self) -> TrainingMaster:
        workers_per_node = int(self.getOrDefault("workersPerNode"))
        if self.training_master is not None:
            given = getattr(self.training_master, "workers_per_node", 1)
            if workers_per_node not in (1, given):
                raise SparkConfigError(
                    f"workers_per_node={workers_per_node} is for the default training master; this estimator "
                    f"was given {type(self.training_master).__name__}: set workers_per_node on it instead")
            for param, keyword in (("storageLevel", "storage_level"), ("scaleMomentum", "scale_momentum"),
                                   ("localSteps", "local_steps")):
                if self.isSet(param):
                    raise SparkConfigError(
                        f"{keyword}={self.getOrDefault(param)!r} is for the default training master; this "
                        f"estimator was given {type(self.training_master).__name__}: set {keyword} on it "
                        "instead")
            return self.training_master
        config = VoidConfiguration()
        port = self._optional("controllerPort")
        if port is not None:
            config = dataclasses.replace(config, unicast_port=int(port))
        level = self._optional("storageLevel")
        kept = {} if level is None else {"storage_level": None if level == "NONE" else level}
        return SharedTrainingMaster(config, batch_size_per_worker=int(self.getOrDefault("batchSize")),
                                    workers_per_node=workers_per_node,
                                    scale_momentum=bool(self.getOrDefault("scaleMomentum")),
                                    local_steps=self.getOrDefault("localSteps"), **kept)

    # -- fit ----------------------------------------------------------------------------------------
    def _fit(self, dataset: DataFrame) -> TorchModel:
        network = self._new_network()
        semantics = self._semantics(network)
        outputs = int(network.num_outputs)
        check_outputs(semantics, outputs)
        check_dataframe_shapes(network, semantics)
        seed = self._optional("seed")
        validation = self._optional("validation")
        per_position = label_positions(network) if per_position_classes(network, semantics.kind) else None
        checks = {"per_position": per_position, "shape": output_shape(network)}
        self._check_frame(dataset, semantics, outputs, **checks)  # the validation rows too, unless their own
        if hasattr(validation, "schema"):
            self._check_frame(validation, semantics, outputs, "the validation DataFrame", **checks)
        train, held_out = split_validation(dataset, validation, int(seed) if seed is not None else 0)
        master = self._master()
        spark_net = SparkNetwork(dataset.sparkSession.sparkContext, network, master)
        model = TorchModel(network, feature_cols=list(self.feature_cols),
                           prediction_col=self.getOrDefault("predictionCol"),
                           probability_col=self.getOrDefault("probabilityCol"), output_kind=semantics.kind)

        held_out_sets = (self._as_rdd(held_out, semantics, outputs, per_position)
                         if held_out is not None else None)

        def score() -> dict[str, float]:
            classes = outputs if semantics.kind == "multiclass" else 2
            found = validation_metrics(model.transform(held_out), self.label_col, model.prediction_col,
                                       semantics.kind, classes)
            # the loss the fit minimises, on the held-out rows
            value = spark_net.do_evaluation(held_out_sets, None, [MeanLoss()])[0].value()
            return {"val_loss": value, **found} if math.isfinite(value) else found

        epochs = int(self.getOrDefault("epochs"))
        epoch_end = EpochEnd(score=score if held_out is not None else None, master=master, network=network,
                             epochs=epochs, callbacks=self.callbacks)
        run_id = self._optional("runId")
        spark_net.fit(self._as_rdd(train, semantics, outputs, per_position), epochs=epochs,
                      callbacks=[epoch_end],
                      checkpoint_dir=self._optional("checkpointDir"),
                      resume=bool(self.getOrDefault("resume")),
                      loggers=self.loggers, **({"run_id": run_id} if run_id else {}))
        model.history = [{"epoch": r.epoch, **r.metrics, **epoch_end.validation.get(r.epoch, {}),
                          "seconds": r.seconds} for r in spark_net.history]
        self.last_history = model.history
        return model

    # -- persistence ----------------------------------------------------------------------------------
    def _json_params(self) -> dict[str, Any]:
        """The Params set on this estimator, as Spark's metadata holds them (plain JSON values)."""
        values = {p.name: v for p, v in self._paramMap.items()}
        if hasattr(values.get("validation"), "schema"):
            raise SparkConfigError(
                f"{type(self).__name__}.save: validation is a DataFrame, which a saved stage cannot hold; "
                "use a fraction (0.2) or the name of a column marking validation rows")
        return values

    def write(self) -> EstimatorWriter:
        return EstimatorWriter(self)

    def save(self, path: str) -> None:
        """A Spark ML stage directory (local path or Hadoop-FS URI); an unfitted Pipeline holding the
        estimator saves it this way. The loggers are not saved."""
        self.write().save(path)

    @classmethod
    def read(cls) -> EstimatorReader:
        return EstimatorReader(cls._from_state)

    @classmethod
    def load(cls, path: str) -> _NetworkEstimator:
        return cls.read().load(path)

    @classmethod
    def _from_state(cls, state: dict[str, Any], params: dict[str, Any]) -> _NetworkEstimator:
        raise NotImplementedError


@add_accessors
class TorchEstimator(_NetworkEstimator):
    """A ``pyspark.ml`` Estimator training a ``torch.nn.Module`` with psrv; ``fit(df) -> TorchModel``.

    Every ``fit`` starts from a copy of ``module`` as given. ``optimizer`` is a factory
    ``params -> torch.optim.Optimizer`` (default Adam(lr=1e-3)); ``training_master`` defaults to
    gradient sharing with ``batch_size`` examples per worker minibatch. The loss decides the output's
    activation and how it predicts (``output_activation``/``output_kind`` override it); ``loggers`` are
    metrics sinks for the fit (TensorBoardLogger, MLflowLogger ...). Every keyword but ``module``,
    ``loss``, ``optimizer``, ``input_shape``, ``training_master``, ``callbacks`` and ``loggers`` is a
    Spark ML Param (``batch_size`` is ``batchSize``; camelCase names are accepted too).
    """

    def __init__(self, module: Any, loss: Any, optimizer: Any = None, input_shape: Sequence[int] | int = (),
                 feature_cols: Sequence[str] | str | None = None, label_col: str | None = None,
                 prediction_col: str | None = None, probability_col: str | None = None,
                 epochs: int | None = None, batch_size: int | None = None,
                 training_master: TrainingMaster | None = None, validation: Any = None,
                 callbacks: Sequence[Any] = (), checkpoint_dir: str | None = None,
                 output_activation: str | None = "auto", seed: int | None = None, *,
                 learning_rate: float | None = None, resume: bool | None = None, run_id: str | None = None,
                 controller_port: int | None = None, output_kind: str | None = None, loggers: Any = None,
                 **params: Any) -> None:
        keywords = {"feature_cols": feature_cols, "label_col": label_col, "prediction_col": prediction_col,
                    "probability_col": probability_col, "epochs": epochs, "batch_size": batch_size,
                    "validation": validation, "checkpoint_dir": checkpoint_dir,
                    "output_activation": output_activation, "seed": seed, "learning_rate": learning_rate,
                    "resume": resume, "run_id": run_id, "controller_port": controller_port,
                    "output_kind": output_kind, **params}
        super().__init__(training_master=training_master, callbacks=callbacks, loggers=loggers,
                         keywords=keywords)
        if not input_shape:
            raise SparkConfigError(
                "input_shape: expected the shape of one example, e.g. (64,) or (1, 28, 28)")
        self.module, self.loss, self.optimizer, self.input_shape = module, loss, optimizer, input_shape
        for_torch_loss(loss, **self._semantics_options())  # an unknown loss without outputKind: refused now

    def _semantics_options(self) -> dict[str, Any]:
        kind = self.getOrDefault("outputKind")
        return {"kind": None if kind == "auto" else kind, "activation": self.getOrDefault("outputActivation")}

    def _semantics(self, network: TrainableNetwork) -> OutputSemantics:
        return for_torch_loss(self.loss, **self._semantics_options())

    def _new_network(self) -> TrainableNetwork:
        semantics = for_torch_loss(self.loss, **self._semantics_options())
        optimizer = self.optimizer
        lr = self._optional("learningRate")
        if lr is not None:
            optimizer = LearningRate(optimizer, float(lr))
        seed = self._optional("seed")
        return TorchNetwork(copy.deepcopy(self.module), copy.deepcopy(self.loss), self.input_shape,
                            optimizer=optimizer, output_activation=semantics.activation,
                            seed=int(seed) if seed is not None else None)

    def _state(self) -> dict[str, Any]:
        return {"module": self.module, "loss": self.loss, "optimizer": self.optimizer,
                "input_shape": self.input_shape, "training_master": self.training_master,
                "callbacks": self.callbacks}

    @classmethod
    def _from_state(cls, state: dict[str, Any], params: dict[str, Any]) -> TorchEstimator:
        return cls(state["module"], state["loss"], state["optimizer"], state["input_shape"],
                   training_master=state["training_master"], callbacks=state["callbacks"], **params)


@add_accessors
class NetworkEstimator(_NetworkEstimator):
    """The same for a ``psrv.nn.Network``: every ``fit`` trains a clone of ``network`` as given; its
    output layer's loss (``mcxent``, ``xent``, ``mse``) decides how it predicts; ``learning_rate`` replaces
    its updater's."""

    def __init__(self, network: LayerNetwork, feature_cols: Sequence[str] | str | None = None,
                 label_col: str | None = None, prediction_col: str | None = None,
                 probability_col: str | None = None, epochs: int | None = None, batch_size: int | None = None,
                 training_master: TrainingMaster | None = None, validation: Any = None,
                 callbacks: Sequence[Any] = (), checkpoint_dir: str | None = None, *,
                 learning_rate: float | None = None, seed: int | None = None, resume: bool | None = None,
                 run_id: str | None = None, controller_port: int | None = None, loggers: Any = None,
                 **params: Any) -> None:
        keywords = {"feature_cols": feature_cols, "label_col": label_col, "prediction_col": prediction_col,
                    "probability_col": probability_col, "epochs": epochs, "batch_size": batch_size,
                    "validation": validation, "checkpoint_dir": checkpoint_dir,
                    "learning_rate": learning_rate, "seed": seed, "resume": resume, "run_id": run_id,
                    "controller_port": controller_port,
                    **params}
        super().__init__(training_master=training_master, callbacks=callbacks, loggers=loggers,
                         keywords=keywords)
        self.network = network

    def _semantics(self, network: TrainableNetwork) -> OutputSemantics:
        layer = network.output_layer  # type: ignore[attr-defined]
        return for_loss_name(layer.loss.name, activation=layer.activation.name)

    def _new_network(self) -> TrainableNetwork:
        network = self.network.clone()
        lr = self._optional("learningRate")
        if lr is not None:
            network.updater.schedule = schedule_from_config(float(lr))
        return network

    def _state(self) -> dict[str, Any]:
        return {"network": self.network, "training_master": self.training_master, "callbacks": self.callbacks}

    @classmethod
    def _from_state(cls, state: dict[str, Any], params: dict[str, Any]) -> NetworkEstimator:
        return cls(state["network"], training_master=state["training_master"], callbacks=state["callbacks"],
                   **params)
