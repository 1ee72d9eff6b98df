"""Weight initialization schemes (Xavier/Glorot, He/Kaiming), drawn from a seeded generator."""

from __future__ import annotations

import numpy as np
from psrv.nn.errors import ConfigError

WEIGHT_INITS = ("xavier", "xavier_uniform", "he", "he_uniform", "zeros")


def init_weights(
    out: np.ndarray, scheme: str, fan_in: int, fan_out: int, rng: np.random.Generator
) -> None:
    """Fill ``out`` (a view into the flat parameter vector) in place."""
    scheme = scheme.lower()
    if scheme == "xavier":
        values = rng.normal(0.0, np.sqrt(2.0 / (fan_in + fan_out)), out.shape)
    elif scheme == "xavier_uniform":
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        values = rng.uniform(-limit, limit, out.shape)
    elif scheme == "he":
        values = rng.normal(0.0, np.sqrt(2.0 / fan_in), out.shape)
    elif scheme == "he_uniform":
        limit = np.sqrt(6.0 / fan_in)
        values = rng.uniform(-limit, limit, out.shape)
    elif scheme == "zeros":
        values = 0.0
    else:
        raise ConfigError(f"unknown weight_init {scheme!r}; expected one of {list(WEIGHT_INITS)}")
    out[...] = values


def check_scheme(scheme: str) -> str:
    if str(scheme).lower() not in WEIGHT_INITS:
        raise ConfigError(f"unknown weight_init {scheme!r}; expected one of {list(WEIGHT_INITS)}")
    return str(scheme).lower()


__all__ = [
    "WEIGHT_INITS",
    "check_scheme",
    "init_weights",
]
