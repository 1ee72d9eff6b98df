"""psrv.nn: the networks being trained: flat parameter buffer, layers, updaters, data, evaluation,
save/load."""

from __future__ import annotations

from psrv.nn.data import DataSet, DataSetLoader, FileDataSetLoader, MultiDataSet
from psrv.nn.errors import (
    ConfigError,
    ForeignFileError,
    InvalidInputError,
    ModelFileError,
    NNError,
    NonFiniteLossError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from psrv.nn.evaluation import (
    ROC,
    Evaluation,
    EvaluationBinary,
    EvaluationCalibration,
    RegressionEvaluation,
    ROCBinary,
    ROCMultiClass,
    evaluation_from_json,
)
from psrv.nn.layers import Conv2D, Dense, Dropout, Flatten, Layer, MaxPool2D, Output
from psrv.nn.momentum import momentum_for_workers
from psrv.nn.network import Network
from psrv.nn.normalizers import ImageScaler, MinMax, Standardize, normalizer_from_state
from psrv.nn.protocol import TrainableNetwork
from psrv.nn.torch_adapter import TorchNetwork
from psrv.nn.torch_io import PerOutput
from psrv.nn.updaters import (
    AdaGrad,
    Adam,
    ExponentialSchedule,
    FixedSchedule,
    Nesterov,
    RmsProp,
    Sgd,
    StepSchedule,
)

__all__ = [
    "DataSet",
    "DataSetLoader",
    "Evaluation",
    "EvaluationBinary",
    "EvaluationCalibration",
    "FileDataSetLoader",
    "ImageScaler",
    "MinMax",
    "MultiDataSet",
    "ROC",
    "ROCBinary",
    "ROCMultiClass",
    "RegressionEvaluation",
    "Standardize",
    "TorchNetwork",
    "normalizer_from_state",
    "evaluation_from_json",
    "PerOutput",
    "AdaGrad",
    "Adam",
    "ConfigError",
    "Conv2D",
    "Dense",
    "Dropout",
    "ExponentialSchedule",
    "FixedSchedule",
    "Flatten",
    "ForeignFileError",
    "InvalidInputError",
    "Layer",
    "MaxPool2D",
    "ModelFileError",
    "NNError",
    "Nesterov",
    "Network",
    "NonFiniteLossError",
    "Output",
    "RmsProp",
    "Sgd",
    "StepSchedule",
    "TruncatedFileError",
    "UnsupportedVersionError",
    "TrainableNetwork",
    "momentum_for_workers",
]
