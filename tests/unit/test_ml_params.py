"""The Spark ML stages' Params without a Spark session: declared, explained, copied, set by the
constructors' snake_case keywords or by their own names, and refused when a value cannot be right."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from psrv.spark.errors import SparkConfigError  # noqa: E402
from psrv.spark.ml import TorchEstimator, TorchModel  # noqa: E402
from psrv.spark.ml.estimator import LearningRate  # noqa: E402


def _estimator(**kwargs) -> TorchEstimator:
    return TorchEstimator(torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss(), input_shape=(4,), **kwargs)


def test_params_are_declared_explained_and_copied() -> None:
    estimator = _estimator(epochs=3, batch_size=8, learning_rate=0.01, validation=0.2, run_id="a")
    names = {p.name for p in estimator.params}
    assert {"featuresCol", "labelCol", "predictionCol", "probabilityCol", "epochs", "batchSize",
            "learningRate", "validation", "seed", "resume", "runId", "controllerPort",
            "checkpointDir"} <= names
    assert "epochs: epochs to train" in estimator.explainParams()
    assert (estimator.getOrDefault("epochs"), estimator.getBatchSize()) == (3, 8)
    assert estimator.getValidation() == 0.2
    copied = estimator.copy({estimator.epochs: 5, estimator.learningRate: 0.1})
    assert (copied.getEpochs(), copied.getLearningRate(), estimator.getEpochs()) == (5, 0.1, 3)
    assert copied.module is estimator.module and copied.uid == estimator.uid
    assert _estimator(batchSize=16, labelCol="y").getBatchSize() == 16  # Spark's own names work too
    assert estimator.setParams(epochs=7).getEpochs() == 7
    model = TorchModel(_estimator()._new_network(), feature_cols=["a", "b"])
    assert model.feature_cols == ("a", "b") and model.getFeaturesCol() == ["a", "b"]
    assert model.output_kind == "multiclass" and isinstance(model.getModel(), torch.nn.Linear)


@pytest.mark.parametrize(("keywords", "message"), [
    ({"epochs": 0}, "epochs"), ({"validation": 1.5}, "fraction"),
    ({"controller_port": 70000}, "controllerPort"),
    ({"output_kind": "ranking"}, "outputKind"), ({"epoch": 2}, "no setting 'epoch'")])
def test_values_that_cannot_be_right_are_refused(keywords, message) -> None:
    with pytest.raises(SparkConfigError, match=message):
        _estimator(**keywords)


def test_learning_rate_reaches_every_group_and_the_file_form() -> None:
    network = _estimator(learning_rate=0.25, optimizer=lambda ps: torch.optim.SGD(ps, lr=1.0))._new_network()
    assert [g["lr"] for g in network.optimizer.param_groups] == [0.25]
    assert network.optimizer.defaults["lr"] == 0.25
    with pytest.raises(SparkConfigError, match="takes no learning rate"):
        LearningRate(_NoLr, 0.1)(torch.nn.Linear(2, 2).parameters())


class _NoLr(torch.optim.Optimizer):
    def __init__(self, params) -> None:
        super().__init__(params, {"momentum": 0.0})


def test_storage_level_reaches_the_default_master_and_is_refused_for_a_given_one() -> None:
    from psrv.spark import SharedTrainingMaster
    from pyspark import StorageLevel

    assert _estimator()._master().storage_level == StorageLevel.MEMORY_ONLY  # unset: the master's default
    estimator = _estimator(storage_level="memory_and_disk")
    assert estimator.getStorageLevel() == "MEMORY_AND_DISK"
    assert estimator._master().storage_level == StorageLevel.MEMORY_AND_DISK
    assert _estimator(storageLevel="NONE")._master().storage_level is None  # recomputed each epoch
    assert _estimator(storage_level=StorageLevel.DISK_ONLY).getStorageLevel() == "DISK_ONLY"  # JSON-able
    copied = estimator.copy({estimator.storageLevel: "DISK_ONLY"})
    assert copied._master().storage_level == StorageLevel.DISK_ONLY
    with pytest.raises(SparkConfigError, match="storageLevel: expected one of"):
        _estimator(storage_level="MEMORY_SOMETIMES")
    given = _estimator(storage_level="DISK_ONLY", training_master=SharedTrainingMaster())
    with pytest.raises(SparkConfigError, match="set storage_level on it instead"):
        given._master()


def test_scale_momentum_reaches_the_default_master_and_is_refused_for_a_given_one() -> None:
    from psrv.encoding import shared_training_threshold
    from psrv.spark import SharedTrainingMaster

    master = _estimator()._master()
    assert master.scale_momentum is True
    assert master.threshold_algorithm == shared_training_threshold()
    assert _estimator().getScaleMomentum() is True
    assert _estimator(scale_momentum=False)._master().scale_momentum is False
    assert _estimator(scaleMomentum=False).getScaleMomentum() is False  # Spark's own name
    assert "scaleMomentum: the default training master sets each worker's momentum (Adam's beta1, SGD's or " \
        "RMSprop's momentum with its lr scaled" in _estimator().explainParams()
    with pytest.raises(SparkConfigError, match="scaleMomentum.*requires value of type bool"):
        _estimator(scale_momentum="sometimes")
    given = _estimator(scale_momentum=False, training_master=SharedTrainingMaster())
    with pytest.raises(SparkConfigError, match="set scale_momentum on it instead"):
        given._master()
