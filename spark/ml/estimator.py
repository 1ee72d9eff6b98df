"""TorchEstimator and NetworkEstimator: ``pyspark.ml`` Estimators that train a psrv network on Spark.

``fit(df)`` turns the DataFrame into DataSets (Arrow batches read in the tasks, Spark's rows without
pyarrow), trains with ``SparkNetwork.fit`` (epochs, validation, callbacks, checkpoints) and returns a
``TorchModel``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psrv.nn.network import Network as LayerNetwork
from psrv.nn.protocol import TrainableNetwork
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark.config import VoidConfiguration
from psrv.spark.data.inputs import _plan_hash
from psrv.spark.data.parquet import ParquetColumns, arrow_datasets, parquet_datasets
from psrv.spark.driver.master import TrainingMaster
from psrv.spark.driver.network import SparkNetwork
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.errors import SparkConfigError
from psrv.spark.ml.model import TorchModel, check_columns, is_classifier
from psrv.spark.task.row_datasets import CHUNK_ROWS, row_converter
from pyspark.ml import Estimator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["NetworkEstimator", "TorchEstimator"]


def _row_datasets(frame: DataFrame, feature_cols: tuple[str, ...], label_col: str,
                  classes: int | None) -> Any:
    """The fallback without pyarrow: Spark's rows, converted one by one in Python."""
    convert = row_converter(feature_cols, label_col, classes)
    return frame.select(*feature_cols, label_col).rdd.mapPartitions(convert)


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

    def _new_network(self) -> TrainableNetwork:
        raise NotImplementedError

    def _as_rdd(self, frame: DataFrame, network: TrainableNetwork) -> Any:
        """DataSets from the DataFrame, read as Arrow batches in the tasks: a plain Parquet scan by the
        tasks from its files, any other DataFrame through ``mapInArrow``; rows only without pyarrow."""
        check_columns(frame, self.feature_cols, "feature_cols")
        check_columns(frame, (self.label_col,), "label_col")
        if self.label_col in self.feature_cols:
            raise SparkConfigError(
                f"label_col {self.label_col!r} is also one of feature_cols {self.feature_cols}")
        classes = int(network.num_outputs) if is_classifier(network) and network.num_outputs > 1 else None
        columns = ParquetColumns(self.feature_cols, self.label_col, classes)
        rdd, path = parquet_datasets(frame, columns, rows=CHUNK_ROWS), "parquet"
        if rdd is None:
            rdd, path = arrow_datasets(frame, columns, rows=CHUNK_ROWS), "arrow"
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

    def _new_network(self) -> TrainableNetwork:
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

    def _new_network(self) -> TrainableNetwork:
        return self.network.clone()
