"""Loss functions of output layers, each fused with its natural activation where that is more stable.

Every loss is averaged over the examples of the batch (DL4J's convention); an optional mask weights
examples (shape (n,) / (n, 1)) or single outputs (shape (n, k)).
"""

from __future__ import annotations

import numpy as np
from psrv.nn.activations import Activation
from psrv.nn.errors import ConfigError


class Loss:
    name: str = ""
    #: the activation the loss needs (None: any)
    requires_activation: str | None = None
    #: labels must lie in [0, 1]
    probability_labels: bool = False

    def loss_and_delta(
        self, z: np.ndarray, a: np.ndarray, y: np.ndarray, mask: np.ndarray | None, act: Activation
    ) -> tuple[float, np.ndarray]:
        """(mean loss, dLoss/dz) for pre-activations z, activations a, labels y."""
        raise NotImplementedError


def _weights(mask: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    if mask is None:
        return None
    m = mask.astype(dtype, copy=False)
    return m.reshape(-1, 1) if m.ndim == 1 else m


def _mean_over_examples(
    per: np.ndarray, delta: np.ndarray, mask: np.ndarray | None, z: np.ndarray
) -> tuple[float, np.ndarray]:
    """(masked per-output losses summed and divided by n, masked delta / n): DL4J's batch average."""
    n = z.shape[0]
    w = _weights(mask, z.dtype)
    if w is not None:
        per = per * w
        delta *= w
    return float(per.sum() / n), delta / z.dtype.type(n)


class McXent(Loss):
    """Multi-class cross-entropy on softmax outputs: -sum(y log p) per example."""

    name = "mcxent"
    requires_activation = "softmax"
    probability_labels = True

    def loss_and_delta(self, z, a, y, mask, act):
        shifted = z - z.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        # d/dz of -sum(y log softmax(z)) is p * sum(y) - y (= p - y for one-hot rows)
        delta = a * y.sum(axis=1, keepdims=True) - y
        return _mean_over_examples(-(y * log_p), delta, mask, z)


class BinaryXent(Loss):
    """Binary cross-entropy on sigmoid outputs, summed over outputs, averaged over examples."""

    name = "xent"
    requires_activation = "sigmoid"
    probability_labels = True

    def loss_and_delta(self, z, a, y, mask, act):
        # -(y log s(z) + (1-y) log(1-s(z))) = softplus(z) - y z, computed without overflow
        per = np.maximum(z, 0) - y * z + np.log1p(np.exp(-np.abs(z)))
        return _mean_over_examples(per, a - y, mask, z)


class Mse(Loss):
    """Mean squared error: mean over outputs of (a - y)^2, averaged over examples; any activation."""

    name = "mse"

    def loss_and_delta(self, z, a, y, mask, act):
        n, k = z.shape[0], int(np.prod(z.shape[1:]))
        diff = a - y
        w = _weights(mask, z.dtype)
        if w is not None:
            diff = diff * w
        loss = float((diff * (a - y)).sum() / (n * k))
        da = diff * z.dtype.type(2.0 / (n * k))
        return loss, act.backward(da, z, a)


_LOSSES: dict[str, type[Loss]] = {
    "mcxent": McXent,
    "cross_entropy": McXent,
    "negativeloglikelihood": McXent,
    "xent": BinaryXent,
    "binary_xent": BinaryXent,
    "mse": Mse,
}

_DEFAULT_LOSS = {"softmax": "mcxent", "sigmoid": "xent"}


def default_loss_for(activation_name: str) -> str:
    return _DEFAULT_LOSS.get(activation_name, "mse")


def get_loss(name: str, activation: Activation) -> Loss:
    cls = _LOSSES.get(str(name).lower())
    if cls is None:
        raise ConfigError(f"unknown loss {name!r}; expected one of {sorted(_LOSSES)}")
    if cls.requires_activation is not None and activation.name != cls.requires_activation:
        raise ConfigError(
            f"loss {cls.name!r} needs activation {cls.requires_activation!r}, got {activation.name!r}"
        )
    return cls()


__all__ = [
    "BinaryXent",
    "Loss",
    "McXent",
    "Mse",
    "default_loss_for",
    "get_loss",
]
