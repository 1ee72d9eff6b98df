"""Activation functions with their backward passes, chosen by name so configurations stay plain data."""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.nn.errors import ConfigError
from psrv.nn.named import build_named


class Activation:
    """An element-wise (or, for softmax, row-wise) function and its vector-Jacobian product."""

    name: str = ""

    def forward(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def backward(self, da: np.ndarray, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. the pre-activation ``z`` given ``da`` = dLoss/d(output) and ``a`` = f(z)."""
        raise NotImplementedError

    def get_config(self) -> Any:
        return self.name


class Identity(Activation):
    name = "identity"

    def forward(self, z: np.ndarray) -> np.ndarray:
        return z

    def backward(self, da: np.ndarray, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return da


class Relu(Activation):
    name = "relu"

    def forward(self, z: np.ndarray) -> np.ndarray:
        return np.maximum(z, 0, dtype=z.dtype)

    def backward(self, da: np.ndarray, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return np.multiply(da, z > 0, dtype=da.dtype)


class LeakyRelu(Activation):
    name = "leakyrelu"

    def __init__(self, alpha: float = 0.01) -> None:
        if not 0.0 <= float(alpha) < 1.0:
            raise ConfigError(f"leakyrelu alpha must be in [0, 1), got {alpha!r}")
        self.alpha = float(alpha)

    def forward(self, z: np.ndarray) -> np.ndarray:
        return np.where(z > 0, z, z * z.dtype.type(self.alpha))

    def backward(self, da: np.ndarray, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return np.where(z > 0, da, da * da.dtype.type(self.alpha))

    def get_config(self) -> Any:
        return self.name if self.alpha == 0.01 else {"name": self.name, "alpha": self.alpha}


class Tanh(Activation):
    name = "tanh"

    def forward(self, z: np.ndarray) -> np.ndarray:
        return np.tanh(z)

    def backward(self, da: np.ndarray, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return da * (1 - a * a)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # exp(-|z|) never overflows; both branches of the usual formula in one expression.
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(z.dtype, copy=False)


class Sigmoid(Activation):
    name = "sigmoid"

    def forward(self, z: np.ndarray) -> np.ndarray:
        return _sigmoid(z)

    def backward(self, da: np.ndarray, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return da * a * (1 - a)


class Softmax(Activation):
    """Softmax over axis 1 (the class axis of (n, k), the channel axis of NCHW)."""

    name = "softmax"

    def forward(self, z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        return e

    def backward(self, da: np.ndarray, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return a * (da - (da * a).sum(axis=1, keepdims=True))


_ACTIVATIONS: dict[str, type[Activation]] = {
    "identity": Identity,
    "linear": Identity,
    "relu": Relu,
    "leakyrelu": LeakyRelu,
    "leaky_relu": LeakyRelu,
    "tanh": Tanh,
    "sigmoid": Sigmoid,
    "softmax": Softmax,
}


def get_activation(spec: str | dict | Activation) -> Activation:
    """An activation from a name ("relu"), a dict ({"name": "leakyrelu", "alpha": 0.2}) or an instance."""
    if isinstance(spec, Activation):
        return spec
    if isinstance(spec, str):
        name, kwargs = spec, {}
    elif isinstance(spec, dict) and "name" in spec:
        kwargs = dict(spec)
        name = kwargs.pop("name")
    else:
        raise ConfigError(f"activation must be a name or a dict with 'name', got {spec!r}")
    return build_named(_ACTIVATIONS, str(name).lower(), kwargs, "activation")


__all__ = [
    "Activation",
    "Identity",
    "LeakyRelu",
    "Relu",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "get_activation",
]
