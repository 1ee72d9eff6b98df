"""Single-process training on scikit-learn's 8x8 digits: the MLP and the LeNet-style CNN reach >= 97%.

The LeNet of DL4J's MNIST example (conv 5x5 -> pool 2x2 -> conv 5x5 -> pool 2x2 -> dense -> softmax)
is adapted to 8x8 images by 'same' padding on both 5x5 convolutions (8x8 -> 4x4 -> 2x2 after pooling).
"""

from __future__ import annotations

import numpy as np
import pytest
from psrv.nn import Adam, Conv2D, Dense, Dropout, ExponentialSchedule, MaxPool2D, Network, Output
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


@pytest.fixture(autouse=True)
def one_blas_thread():
    # the CPU is shared: a spinning multi-threaded BLAS on tiny matrices is many times slower
    with threadpool_limits(1, user_api="blas"):
        yield


def _accuracy(net: Network, x, y) -> float:
    return float((net.predict(x) == y).mean())


@pytest.mark.timeout(60)
def test_mlp_reaches_97_percent(digits) -> None:
    x_train, x_test, y_train, y_test = digits
    net = Network([Dense(256), Dense(128), Output(10)], input_shape=(64,), updater=Adam(1e-3), seed=0)
    net.fit((x_train, y_train), epochs=25, batch_size=32)
    assert _accuracy(net, x_test, y_test) >= 0.97
    assert net.epoch == 25
    evaluation = net.evaluate((x_test, np.eye(10, dtype=np.float32)[y_test]))
    assert evaluation.accuracy() == pytest.approx(_accuracy(net, x_test, y_test))


@pytest.mark.timeout(60)
def test_lenet_style_cnn_reaches_97_percent(digits) -> None:
    x_train, x_test, y_train, y_test = digits
    net = Network(
        [Conv2D(16, 5, padding="same"), MaxPool2D(2), Conv2D(32, 5, padding="same"), MaxPool2D(2),
         Dropout(0.3), Dense(64), Output(10)],
        input_shape=(1, 8, 8), updater=Adam(ExponentialSchedule(2e-3, 0.997)), seed=0,
    )
    net.fit((x_train, y_train), epochs=15, batch_size=32)
    assert _accuracy(net, x_test, y_test) >= 0.97
