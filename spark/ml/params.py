"""The Spark ML Params of psrv's stages, so ``explainParams``, ``copy(extra)``, ``fit(df, paramMap)``,
``ParamGridBuilder``, ``CrossValidator`` and ``TrainValidationSplit`` see their settings.

Each Param also has a snake_case keyword in the constructors (``SNAKE_CASE``), the names README uses.
"""

from __future__ import annotations

from typing import Any

from psrv.spark.data.storage_level import STORAGE_LEVELS
from psrv.spark.errors import SparkConfigError
from pyspark import StorageLevel
from pyspark.ml.param import Param, Params, TypeConverters

__all__ = ["SNAKE_CASE", "EstimatorParams", "ModelParams", "add_accessors", "columns_of", "set_from_keywords",
           "to_columns"]


def to_columns(value: Any) -> Any:
    """One column name (a string), or several (a list of strings, concatenated in order)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"expected a column name or a non-empty list of column names, got {value!r}")


def columns_of(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _to_validation(value: Any) -> Any:
    """A fraction in (0, 1), the name of a boolean / 0-1 column marking validation rows, or a DataFrame."""
    if isinstance(value, bool):
        raise TypeError(f"validation: expected a fraction, a column name or a DataFrame, got {value!r}")
    if isinstance(value, int | float):
        if not 0.0 < float(value) < 1.0:
            raise TypeError(f"validation: a fraction must be in (0, 1), got {value!r}")
        return float(value)
    if isinstance(value, str) or hasattr(value, "schema"):
        return value
    raise TypeError(f"validation: expected a fraction (0.2), a column name or a DataFrame, got "
                    f"{type(value).__name__}")


def _to_activation(value: Any) -> Any:
    if value in ("auto", "softmax", "sigmoid"):
        return value
    if value in ("none", "None"):
        return None
    raise TypeError(f"outputActivation: expected 'auto', 'softmax', 'sigmoid' or None, got {value!r}")


def _to_kind(value: Any) -> Any:
    if value in ("auto", "multiclass", "binary", "regression"):
        return value
    raise TypeError(f"outputKind: expected 'auto', 'multiclass', 'binary' or 'regression', got {value!r}")


def _to_storage_level(value: Any) -> Any:
    """A storage level's name (``MEMORY_AND_DISK``; a pyspark ``StorageLevel`` becomes its name), or
    ``"NONE"`` for no caching: a name, so a saved stage records it as JSON."""
    if isinstance(value, str) and value.upper() in (*STORAGE_LEVELS, "NONE"):
        return value.upper()
    if value is not None and not isinstance(value, str):
        for name in STORAGE_LEVELS:
            if getattr(StorageLevel, name, None) == value:
                return name
    raise TypeError(f"storageLevel: expected one of {STORAGE_LEVELS} or 'NONE' (no caching), got {value!r}")


def _to_port(value: Any) -> Any:
    port = TypeConverters.toInt(value)
    if not 0 <= port <= 65535:
        raise TypeError(f"controllerPort: expected 0 (any free port) .. 65535, got {value!r}")
    return port


def _positive(name: str) -> Any:
    def convert(value: Any) -> int:
        number = TypeConverters.toInt(value)
        if number < 1:
            raise TypeError(f"{name}: expected a positive int, got {value!r}")
        return number
    return convert


def _to_local_steps(value: Any) -> Any:
    """"auto" (the default training master's choice: psrv.spark.driver.stepping), or a positive int."""
    if isinstance(value, str) and value == "auto":
        return value
    try:
        if isinstance(value, str | bool):
            raise TypeError
        return _positive("localSteps")(value)
    except TypeError:
        raise TypeError(f"localSteps: expected 'auto' or a positive int, got {value!r}") from None


def _param(name: str, doc: str, converter: Any = TypeConverters.identity) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=converter)


class ModelParams(Params):
    """What a fitted model scores with: feature and output columns."""

    featuresCol = _param("featuresCol", "feature column(s): an array, an ML Vector or numbers; several "
                         "are concatenated in order", to_columns)
    predictionCol = _param("predictionCol", "prediction column name", TypeConverters.toString)
    probabilityCol = _param("probabilityCol", "probability column name (classification losses only)",
                            TypeConverters.toString)
    outputKind = _param("outputKind", "what the output means: 'auto' (from the loss), 'multiclass' "
                        "(argmax), 'binary' (threshold 0.5) or 'regression' (the raw output)", _to_kind)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(featuresCol="features", predictionCol="prediction", probabilityCol="probability",
                         outputKind="auto")


class EstimatorParams(ModelParams):
    """What a fit trains with."""

    labelCol = _param("labelCol", "label column name", TypeConverters.toString)
    epochs = _param("epochs", "epochs to train (in total, counting a resumed run's)", _positive("epochs"))
    batchSize = _param("batchSize", "examples per worker minibatch (the default training master's)",
                       _positive("batchSize"))
    learningRate = _param("learningRate", "the optimizer's learning rate (unset: the optimizer's own)",
                          TypeConverters.toFloat)
    validation = _param("validation", "held-out data scored after every epoch: a fraction (a seeded "
                        "random split inside fit), the name of a boolean / 0-1 column marking validation "
                        "rows, or a DataFrame", _to_validation)
    seed = _param("seed", "seed of the module's initialisation, shuffling and the validation split",
                  TypeConverters.toInt)
    checkpointDir = _param("checkpointDir", "where each epoch's checkpoint goes (a local path or a "
                           "Hadoop-FS URI)",
                           TypeConverters.toString)
    resume = _param("resume", "continue the run from its newest checkpoint in checkpointDir",
                    TypeConverters.toBoolean)
    runId = _param("runId", "the run's name under checkpointDir (unset: a fresh one per fit)",
                   TypeConverters.toString)
    controllerPort = _param("controllerPort", "the gradient-sharing controller's port on the driver "
                            "(0: any free port) for the default training master", _to_port)
    outputActivation = _param("outputActivation", "activation of the output for predictions: 'auto' "
                              "(from the loss), 'softmax', 'sigmoid' or None", _to_activation)
    workersPerNode = _param("workersPerNode", "local workers behind each Spark task's one mesh member (one "
                            "per GPU the task holds, else threads) for the default training master",
                            _positive("workersPerNode"))
    storageLevel = _param("storageLevel", "how the default training master keeps the data between epochs "
                          "(rdd_training_approach 'direct'): a StorageLevel name such as MEMORY_AND_DISK, or "
                          "NONE to recompute each epoch (unset: the master's default, MEMORY_ONLY)",
                          _to_storage_level)
    scaleMomentum = _param("scaleMomentum", "the default training master sets each worker's momentum "
                           "(Adam's beta1, SGD's or RMSprop's momentum with its lr scaled to keep the "
                           "step's size) to beta ** (workers sharing), so the shared model's momentum "
                           "forgets per minibatch as one process's does, and starts RMSprop's square "
                           "average at the first gradient's square rather than zero (False: the "
                           "optimizer as given)",
                           TypeConverters.toBoolean)
    localSteps = _param("localSteps", "optimizer steps a message for the default training master: each "
                        "worker splits every minibatch into this many pieces, steps on each in turn and "
                        "sends the sum once (the same bytes; more compute; 1: one step a minibatch); 'auto' "
                        "takes 2 for a model of at most 500,000 parameters with Adam or RMSprop (or SGD with "
                        "at most 4 workers side by side) on minibatches of 16 rows or more, else 1",
                        _to_local_steps)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(labelCol="label", epochs=1, batchSize=32, resume=False, outputActivation="auto")
        self._setDefault(workersPerNode=1, scaleMomentum=True, localSteps="auto")


#: constructor keyword -> Param name
SNAKE_CASE = {
    "feature_cols": "featuresCol", "label_col": "labelCol", "prediction_col": "predictionCol",
    "probability_col": "probabilityCol", "epochs": "epochs", "batch_size": "batchSize",
    "learning_rate": "learningRate", "validation": "validation", "seed": "seed",
    "checkpoint_dir": "checkpointDir", "resume": "resume", "run_id": "runId",
    "controller_port": "controllerPort", "output_activation": "outputActivation", "output_kind": "outputKind",
    "workers_per_node": "workersPerNode", "storage_level": "storageLevel", "scale_momentum": "scaleMomentum",
    "local_steps": "localSteps",
}


def set_from_keywords(stage: Params, keywords: dict[str, Any]) -> None:
    """Set the Params named by snake_case keywords (None leaves a Param unset) or by their own names."""
    values: dict[str, Any] = {}
    for key, value in keywords.items():
        name = SNAKE_CASE.get(key, key)
        if not stage.hasParam(name):
            raise SparkConfigError(f"{type(stage).__name__}: no setting {key!r}; its Params are "
                                   f"{sorted(p.name for p in stage.params)}")
        if (value is None and name != "outputActivation") or (name == "outputActivation" and value == "auto"):
            continue
        values[name] = value
    try:
        stage._set(**values)
    except TypeError as exc:
        raise SparkConfigError(f"{type(stage).__name__}: {exc}") from exc


def add_accessors(cls: type) -> type:
    """``getX()`` and ``setX(value)`` for every Param ``X`` the class declares (pyspark's convention)."""
    for name in dir(cls):
        if not isinstance(getattr(cls, name, None), Param):
            continue
        title = name[0].upper() + name[1:]
        if not hasattr(cls, f"get{title}"):
            setattr(cls, f"get{title}", lambda self, _n=name: self.getOrDefault(_n))
        if not hasattr(cls, f"set{title}"):
            setattr(cls, f"set{title}", lambda self, value, _n=name: self._set(**{_n: value}))
    return cls
