"""psrv.nn: the networks being trained: flat parameter buffer, layers, updaters, data, evaluation,
save/load."""

from __future__ import annotations

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
from psrv.nn.layers import Conv2D, Dense, Dropout, Flatten, Layer, MaxPool2D, Output
from psrv.nn.network import Network
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
]
