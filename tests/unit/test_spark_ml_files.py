"""psrv.spark.ml model files without Spark: the single model file an earlier TorchModel.save wrote still
loads (no SparkContext needed), a directory that is not a saved TorchModel is refused clearly, and Spark's
metadata keeps naming the class by the dotted name saved pipelines recorded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from psrv.nn import Dense, Network, Output
from psrv.spark import storage
from psrv.spark.errors import SparkInputError
from psrv.spark.ml import TorchModel


def _model() -> TorchModel:
    network = Network([Dense(4, "relu"), Output(3)], input_shape=(5,), seed=3)
    return TorchModel(network, feature_cols=["a", "b"], prediction_col="p", probability_col="q")


def test_single_model_file_loads_without_spark(tmp_path: Path) -> None:
    model = _model()
    path = str(tmp_path / "model.psrv")
    storage.write_bytes(path, model._record())  # what TorchModel.save wrote before the directory layout
    loaded = TorchModel.load(path)
    np.testing.assert_array_equal(loaded.network.params, model.network.params)
    assert (loaded.feature_cols, loaded.prediction_col, loaded.probability_col) == (("a", "b"), "p", "q")


def test_directory_without_metadata_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stage").mkdir()
    with pytest.raises(SparkInputError, match="not a saved TorchModel.*metadata"):
        TorchModel.load(str(tmp_path / "stage"))


def test_spark_metadata_names_the_class_where_pipelines_saved_before_find_it() -> None:
    """Spark ML records ``instance.__module__ + "." + class name`` and PipelineModel.load imports that module
    and takes the attribute: saved pipelines name psrv.spark.ml.TorchModel, so it must stay that."""
    import importlib

    model = _model()
    recorded = f"{model.__module__}.{type(model).__name__}"
    assert recorded == "psrv.spark.ml.TorchModel"
    module, _, name = recorded.rpartition(".")
    assert getattr(importlib.import_module(module), name) is TorchModel
