"""SparkNetwork: a psrv network trained and evaluated on a Spark cluster (DL4J's SparkDl4jMultiLayer).

Training is delegated to a training master (parameter averaging, or gradient sharing); evaluation
and inference need no master: the network travels to the executors as configuration + flat
vectors and partial results are merged on the way back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psrv.nn.data import DATA_FILE_SUFFIX, FileDataSetLoader
from psrv.nn.evaluation import ROC, Evaluation, RegressionEvaluation, ROCMultiClass
from psrv.nn.network import Network as LayerNetwork
from psrv.nn.protocol import TrainableNetwork
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark.data.batching import check_batch_size
from psrv.spark.data.files import list_paths
from psrv.spark.data.inputs import classes_of, dataframe_to_datasets, is_dataframe
from psrv.spark.data.inputs_multi import dataframe_to_multidatasets, is_multi_columns
from psrv.spark.driver import evaluation as distributed
from psrv.spark.driver import preflight, shipping
from psrv.spark.driver.epochs import MinibatchFiles, run_epochs
from psrv.spark.driver.job_errors import worker_errors
from psrv.spark.driver.master import TrainingMaster
from psrv.spark.driver.partitioning import needs_repartition
from psrv.spark.errors import SparkConfigError, SparkInputError
from psrv.spark.observe.metrics import watching
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.inference import MeanLoss

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

log = logging.getLogger(__name__)

DEFAULT_EVAL_BATCH_SIZE = 64


class SparkNetwork:
    """Train, evaluate and run a psrv ``TrainableNetwork`` on Spark.

    ``network`` is the driver's network: ``fit`` updates it in place (and returns it);
    ``training_master`` may be None when the network is only evaluated or used for inference.
    Before a training job, ``fit`` checks on the driver what would otherwise fail on the executors
    (the user's code can be shipped, the columns exist, a sample fits the network, a minibatch is not
    larger than each worker's data); ``check_data=False`` skips the one light pass over the data the
    last two need.

    A TorchNetwork of several inputs or outputs trains on RDDs of MultiDataSets, or on a DataFrame with
    ``features_col`` one entry per input (a column, or a tuple of numeric columns concatenated) and
    ``label_col`` one column per output (psrv.spark.data.inputs_multi).
    """

    def __init__(self, spark_context: SparkContext, network: TrainableNetwork,
                 training_master: TrainingMaster | None = None, *,
                 eval_batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
                 features_col: str | Sequence[Any] = "features", label_col: str | Sequence[str] = "label",
                 check_data: bool = True) -> None:
        if hasattr(spark_context, "sparkContext") and not hasattr(spark_context, "parallelize"):
            spark_context = spark_context.sparkContext  # a SparkSession was given
        if spark_context is None or not hasattr(spark_context, "parallelize"):
            raise SparkConfigError(f"expected a SparkContext, got {type(spark_context).__name__}")
        if not isinstance(network, TrainableNetwork):
            raise SparkConfigError(f"expected a psrv.nn.Network, got {type(network).__name__}")
        self.spark_context = spark_context
        self.network = network
        self.training_master = training_master
        self.eval_batch_size = check_batch_size(eval_batch_size, "eval_batch_size")
        self.features_col = features_col
        self.label_col = label_col
        self.check_data = bool(check_data)
        self.history: list[Any] = []  # an epochs.EpochRecord per epoch of the last multi-epoch fit
        self.run_id: str | None = None  # the run the last fit with a checkpoint_dir wrote to

    def __repr__(self) -> str:
        return f"SparkNetwork({self.network!r}, training_master={self.training_master!r})"

    # -- data ---------------------------------------------------------------------------------------
    def _as_rdd(self, data: Any) -> RDD:
        if is_dataframe(data):
            if is_multi_columns(self.features_col, self.label_col):  # several column groups: MultiDataSets
                return dataframe_to_multidatasets(data, self.network, self.features_col, self.label_col)
            preflight.check_columns(data.columns, self.features_col, self.label_col)
            return dataframe_to_datasets(data, features_col=self.features_col, label_col=self.label_col,
                                         num_classes=classes_of(self.network))
        if not hasattr(data, "mapPartitions"):
            raise SparkInputError(f"expected an RDD of DataSets or a DataFrame, got {type(data).__name__}")
        return data

    def _master(self) -> TrainingMaster:
        if self.training_master is None:
            raise SparkConfigError(
                "this SparkNetwork has no training master: pass one, e.g. "
                "SparkNetwork(sc, network, ParameterAveragingTrainingMaster())"
            )
        return self.training_master

    # -- training -----------------------------------------------------------------------------------
    def fit(self, data: Any, epochs: int = 1, validation_data: Any = None, callbacks: Sequence[Any] = (),
            checkpoint_dir: str | None = None, resume: bool = False, *, run_id: str | None = None,
            loggers: Any = None, progress: bool | None = None) -> Any:
        """Train on an RDD of DataSets, a DataFrame with feature and label columns, or the URI of a
        directory of exported minibatch files (any storage-layer URI: a local path, ``file://``,
        ``s3a://``, ``hdfs://`` ...; what ``batch_and_export`` writes); returns the network.

        One call trains ``epochs`` epochs on data exported (or cached) once. After each epoch the driver's
        network (the master copy) is evaluated on ``validation_data`` (``val_accuracy``, ``val_f1`` ... or
        ``val_mse``, ``val_r2`` ...), the metrics (with the training ``loss``) go to each callback's
        ``on_epoch_end(epoch, metrics)`` (True stops the fit; e.g. ``EarlyStopping``) and a checkpoint is
        written to ``checkpoint_dir/<run_id>`` (local path or Hadoop-FS URI; ``run_id`` default: a fresh
        id, logged at start and kept in ``self.run_id``; a fit never writes into another run's directory).
        ``resume=True`` first loads the newest checkpoint of run ``run_id`` (default: the run that wrote
        the last checkpoint under ``checkpoint_dir``) and trains the epochs still missing to reach
        ``epochs``. ``self.history`` holds
        one record (epoch, metrics, seconds) per epoch. ``loggers``: metrics sinks for this call, besides
        the master's (see psrv.spark.observe.metrics); ``progress``: live progress on stderr (default: the
        master's).
        """
        master = self._master()
        shipping.check_network(self.network, self.spark_context)  # before anything touches the data
        if isinstance(data, str):  # a directory of exported minibatches
            files = self._minibatch_files(data)
            preflight.check_environment(self.spark_context)
            with watching(master, loggers, progress), worker_errors("fit"):
                self.history = run_epochs(self, files, epochs, validation_data, callbacks, checkpoint_dir,
                                          resume, run_id=run_id)
            return self.network
        rdd = self._as_rdd(data)
        preflight.check_environment(self.spark_context)  # the first job: the executors can run psrv
        profile = self._check_before_training(rdd)
        plain = validation_data is None and not callbacks and checkpoint_dir is None and not resume \
            and run_id is None
        with watching(master, loggers, progress):
            if epochs == 1 and plain:
                with worker_errors("fit"):  # one epoch, exactly as the training master trains it
                    master.execute_training(self.spark_context, self.network, rdd)
                return self.network
            counts = profile.element_counts() if profile is not None else None
            with worker_errors("fit"):
                self.history = run_epochs(self, rdd, epochs, validation_data, callbacks, checkpoint_dir,
                                          resume, element_counts=counts, run_id=run_id)
        return self.network

    def fit_paths(self, paths_rdd: RDD, loader: Any | None = None, *, loggers: Any = None,
                  progress: bool | None = None) -> Any:
        """One epoch over minibatch files; ``loader.load(path) -> DataSet`` (default: psrv's file form)."""
        master = self._master()
        shipping.check_loader(loader, self.spark_context)
        shipping.check_network(self.network, self.spark_context)
        preflight.check_environment(self.spark_context)
        with watching(master, loggers, progress), worker_errors("fit_paths"):
            master.execute_training_paths(self.spark_context, self.network, paths_rdd, loader)
        return self.network

    def _minibatch_files(self, directory: str) -> MinibatchFiles:
        """The exported minibatch files under ``directory``, listed on the driver (none: an error)."""
        paths = list_paths(self.spark_context, directory, suffix=DATA_FILE_SUFFIX)
        if not paths:
            raise SparkInputError(
                f"fit: no minibatch files (*{DATA_FILE_SUFFIX}) under {directory!r}; write them with "
                "psrv.spark.data.batch_and_export or export_datasets, or pass an RDD or a DataFrame")
        return MinibatchFiles(paths)

    def _check_before_training(self, rdd: RDD) -> preflight.DataProfile | None:
        """What would fail on the executors (given the data), said on the driver before the training job;
        returns what the pass over the data learned (None with ``check_data=False``)."""
        if not self.check_data:
            return None
        with worker_errors("fit (checking the data)"):
            profile = preflight.profile(rdd)
        master = self._master()
        workers = int(master.workers(self.spark_context))
        repartitioned = needs_repartition(master.repartition, rdd.getNumPartitions(), workers)
        preflight.check_batch_fits(int(master.batch_size_per_worker), profile, workers, repartitioned)
        preflight.check_sample(self.network, profile.sample, self.label_col)
        preflight.check_finite_data(profile)
        return profile

    def get_network(self) -> TrainableNetwork:
        """The driver's network (trained in place by ``fit``)."""
        return self.network

    def get_score(self) -> float | None:
        """Mean training loss of the last averaging round / last fit, if known."""
        return self.training_master.last_score if self.training_master is not None else None

    def get_training_stats(self) -> list[dict[str, Any]]:
        """Per-worker wall-clock events collected with ``collect_training_stats=True``."""
        return list(self.training_master.training_stats) if self.training_master is not None else []

    # -- evaluation ---------------------------------------------------------------------------------
    def _payload(self) -> NetworkPayload:
        return NetworkPayload.from_network(self.network)

    def do_evaluation(self, data: Any, batch_size: int | None, evaluations: Sequence[Any]) -> list[Any]:
        """Several evaluations in one pass over ``data``; returns new merged results, in order."""
        with worker_errors("evaluation"):
            return distributed.do_evaluation(self.spark_context, self._payload(), self._as_rdd(data),
                                             batch_size or self.eval_batch_size, evaluations)

    def do_evaluation_paths(self, paths_rdd: RDD, batch_size: int | None, evaluations: Sequence[Any],
                            loader: Any | None = None) -> list[Any]:
        """As :meth:`do_evaluation`, over minibatch files read with ``loader`` (default: psrv's form)."""
        shipping.check_loader(loader, self.spark_context)
        with worker_errors("evaluation"):
            return distributed.do_evaluation(self.spark_context, self._payload(), paths_rdd,
                                             batch_size or self.eval_batch_size, evaluations,
                                             loader=loader or FileDataSetLoader())

    def _classification(self) -> Any:
        """What ``Network.evaluate`` picks by default: regression metrics for an MSE output, else
        classification (a single sigmoid output counts as two classes)."""
        network = self.network
        if isinstance(network, TorchNetwork) and network.multi_output:  # one per output (psrv.nn.torch_io)
            return network.layout.default_evaluations()
        if isinstance(network, TorchNetwork) and not network.layout.output_shapes[0]:  # an (n,) head
            return network.layout.default_evaluation(0)
        if isinstance(network, LayerNetwork) and network.output_layer.loss.name == "mse":
            return RegressionEvaluation()
        classes = classes_of(self.network)
        return Evaluation(num_classes=classes if classes is not None else 2)

    def evaluate(self, data: Any, batch_size: int | None = None) -> Any:
        """Classification metrics (accuracy, precision, recall, F1, confusion matrix); regression
        metrics for a network with an MSE output, as ``Network.evaluate`` does locally. A TorchNetwork of
        several outputs gives a list (psrv.nn.torch_io.PerOutput): one result per output."""
        return self.do_evaluation(data, batch_size, [self._classification()])[0]

    def evaluate_with_loss(self, data: Any, batch_size: int | None = None) -> tuple[Any, float]:
        """What :meth:`evaluate` gives, and the network's mean loss per example on ``data`` (NaN for a
        network without ``score``), in one pass over the data."""
        evaluation, loss = self.do_evaluation(data, batch_size, [self._classification(), MeanLoss()])
        return evaluation, loss.value()

    def evaluate_paths(self, paths_rdd: RDD, loader: Any | None = None, batch_size: int | None = None) -> Any:
        return self.do_evaluation_paths(paths_rdd, batch_size, [self._classification()], loader)[0]

    def evaluate_roc(self, data: Any, threshold_steps: int = 0, batch_size: int | None = None) -> Any:
        """Binary ROC (exact when ``threshold_steps`` is 0)."""
        return self.do_evaluation(data, batch_size, [ROC(threshold_steps)])[0]

    def evaluate_roc_multi_class(self, data: Any, threshold_steps: int = 0,
                                 batch_size: int | None = None) -> Any:
        """One-vs-all ROC per class."""
        return self.do_evaluation(data, batch_size, [ROCMultiClass(threshold_steps)])[0]

    def evaluate_regression(self, data: Any, batch_size: int | None = None) -> Any:
        """MSE, MAE, RMSE, R^2 per output column."""
        return self.do_evaluation(data, batch_size, [RegressionEvaluation()])[0]

    # -- inference ----------------------------------------------------------------------------------
    def feed_forward_with_key(self, pair_rdd: RDD, batch_size: int | None = None) -> RDD:
        """``(key, prediction)`` per ``(key, features)`` / ``(key, (features, mask))`` of one example; for a
        TorchNetwork of several inputs the value is a list of one array per input, and of several outputs
        the prediction is a list of one array per output."""
        return distributed.feed_forward_with_key(self.spark_context, self._payload(), pair_rdd,
                                                 batch_size or self.eval_batch_size)

    def output(self, data: Any) -> RDD:
        """The network's output on each element of an RDD of DataSets or MultiDataSets (in order): an
        array, or a list of arrays (one per output) for a network of several outputs. Lazy."""
        if not hasattr(data, "mapPartitions"):
            raise SparkInputError(
                f"output: expected an RDD of DataSets or MultiDataSets, got {type(data).__name__}")
        return distributed.outputs_of(self.spark_context, self._payload(), data)

    # -- results on disk ----------------------------------------------------------------------------
    def save_evaluations(self, evaluations: Any, path: str) -> None:
        """JSON file at a local path or any Spark (Hadoop) file system URI."""
        distributed.save_evaluations(evaluations, path, self.spark_context)

    def load_evaluations(self, path: str) -> list[Any]:
        return distributed.load_evaluations(path, self.spark_context)

    # -- temporary files ----------------------------------------------------------------------------
    def delete_temp_files(self) -> int:
        """Remove the data exports the training master wrote in psrv's default location (files under a
        user-given ``export_directory`` are kept); the next ``fit`` exports again."""
        return int(self.training_master.delete_temp_files()) if self.training_master is not None else 0

    def close(self) -> None:
        """Release what this SparkNetwork holds on the cluster (its temporary exports)."""
        self.delete_temp_files()

    def __enter__(self) -> SparkNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_EVAL_BATCH_SIZE", "SparkNetwork"]
