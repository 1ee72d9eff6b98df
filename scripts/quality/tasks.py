"""The tasks of the quality harness: data this machine makes, a module factory and training settings.

Every task is small enough that one run of one method takes seconds on one CPU thread; none is tuned to
one data set. ``TASKS`` names them; ``make(name, seed)`` returns a ``Task`` with its data made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["TASKS", "Task", "make"]


@dataclass
class Task:
    """One learning problem: float32 features, int64 class labels, a module factory and its budget."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    build: Callable[[], nn.Module]
    epochs: int
    batch_size: int = 32

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def _split(x: np.ndarray, y: np.ndarray, test: int) -> tuple[np.ndarray, ...]:
    return x[:-test].astype(np.float32), y[:-test].astype(np.int64), \
        x[-test:].astype(np.float32), y[-test:].astype(np.int64)


def _tabular(seed: int, rows: int = 50_000, features: int = 40, classes: int = 4) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=rows, n_features=features, n_informative=20, n_redundant=10,
                               n_classes=classes, n_clusters_per_class=3, class_sep=1.0, flip_y=0.02,
                               random_state=1000 + seed)
    x = (x - x.mean(0)) / x.std(0)
    return _split(x, y, rows // 5)


def mlp(seed: int) -> Task:
    """An MLP (about 11 k parameters) on make_classification's 50 k rows (40 features, 4 classes)."""
    data = _tabular(seed)

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 4))

    return Task("mlp", *data, classes=4, build=build, epochs=1)


def cnn(seed: int) -> Task:
    """A small CNN (about 10 k parameters) on scikit-learn's digits, upscaled to 16x16 with noise."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(2000 + seed)
    order = rng.permutation(len(digits.target))
    images = digits.images[order] / 16.0
    images = images.repeat(2, axis=1).repeat(2, axis=2)  # 16x16
    images = images + rng.normal(0, 0.1, size=images.shape)
    x = images[:, None, :, :]
    data = _split(x, digits.target[order], 400)

    def build() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(16 * 16, 32), nn.ReLU(), nn.Linear(32, 10))

    return Task("cnn", *data, classes=10, build=build, epochs=4)


def sequence(seed: int, rows: int = 8_000, length: int = 32) -> Task:
    """A 1-D CNN (about 1.5 k parameters) telling which of 4 motifs hides somewhere in a noisy sequence."""
    rng = np.random.default_rng(3000 + seed)
    motifs = rng.normal(0, 1, size=(4, 6))
    y = rng.integers(0, 4, size=rows)
    x = rng.normal(0, 1.0, size=(rows, length))
    starts = rng.integers(0, length - 6, size=rows)
    for i in range(rows):
        x[i, starts[i]:starts[i] + 6] += 1.5 * motifs[y[i]]
    data = _split(x[:, None, :], y, rows // 6)

    def build() -> nn.Module:
        return nn.Sequential(nn.Conv1d(1, 8, 7, padding=3), nn.ReLU(), nn.Conv1d(8, 16, 5, padding=2),
                             nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(16, 4))

    return Task("seq", *data, classes=4, build=build, epochs=2)


def mlp1m(seed: int) -> Task:
    """The 1 M-parameter MLP (256-1024-768-10, 1.06 M parameters) on make_classification (14 k rows)."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=14_000, n_features=256, n_informative=64, n_redundant=32,
                               n_classes=10, n_clusters_per_class=2, class_sep=1.2, flip_y=0.01,
                               random_state=4000 + seed)
    x = (x - x.mean(0)) / x.std(0)
    data = _split(x, y, 2000)

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 768), nn.ReLU(),
                             nn.Linear(768, 10))

    return Task("mlp1m", *data, classes=10, build=build, epochs=1)


def tiny(seed: int, rows: int = 512) -> Task:
    """A tiny float64 problem for exact tests (a linear layer and a hidden one, 3 classes)."""
    rng = np.random.default_rng(5000 + seed)
    x = rng.normal(size=(rows, 5))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    data = _split(x, y, rows // 4)

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))

    return Task("tiny", *data, classes=3, build=build, epochs=1, batch_size=8)


TASKS: dict[str, Callable[[int], Task]] = {"mlp": mlp, "cnn": cnn, "seq": sequence, "mlp1m": mlp1m,
                                           "tiny": tiny}


def make(name: str, seed: int = 0, **overrides: Any) -> Task:
    """The task ``name`` with its data made from ``seed``; ``overrides`` replace settings (epochs ...)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    task = TASKS[name](seed)
    for key, value in overrides.items():
        setattr(task, key, value)
    torch.manual_seed(seed)
    return task
