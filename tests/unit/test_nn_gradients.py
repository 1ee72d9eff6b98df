"""Finite-difference gradient checks (float64) for every layer, activation and loss of psrv.nn."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.nn import Conv2D, Dense, Dropout, Flatten, MaxPool2D, Network, Output, Sgd


def _check_gradient(net: Network, x, y, mask=None, eps: float = 1e-6, tol: float = 1e-5) -> None:
    analytic, _ = net.compute_gradient(x, y, mask)
    params = net.params
    numeric = np.empty_like(analytic)
    for i in range(params.size):
        saved = params[i]
        params[i] = saved + eps
        _, plus = net.compute_gradient(x, y, mask)
        params[i] = saved - eps
        _, minus = net.compute_gradient(x, y, mask)
        params[i] = saved
        numeric[i] = (plus - minus) / (2 * eps)
    scale = np.maximum(1.0, np.abs(numeric) + np.abs(analytic))
    err = np.abs(numeric - analytic) / scale
    assert err.max() < tol, f"max relative error {err.max():.3g} at param {err.argmax()}"
    assert np.abs(analytic).max() > 1e-4  # the check saw a real gradient


def _data(n: int, n_in: int, n_out: int, kind: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_in))
    if kind == "onehot":
        y = np.eye(n_out)[rng.integers(0, n_out, n)]
    elif kind == "binary":
        y = (rng.random((n, n_out)) > 0.5).astype(float)
    else:
        y = rng.normal(size=(n, n_out))
    return x, y


@pytest.mark.parametrize("activation", ["relu", "leakyrelu", "tanh", "sigmoid", "identity", "softmax",
                                        {"name": "leakyrelu", "alpha": 0.2}])
def test_dense_activations(activation) -> None:
    x, y = _data(6, 5, 3, "regression")
    net = Network([Dense(4, activation=activation), Output(3, activation="identity", loss="mse")],
                  input_shape=(5,), seed=3, dtype="float64", updater=Sgd(0.1))
    _check_gradient(net, x, y)


@pytest.mark.parametrize(
    ("activation", "loss", "kind"),
    [("softmax", "mcxent", "onehot"), ("sigmoid", "xent", "binary"), ("identity", "mse", "regression"),
     ("tanh", "mse", "regression"), ("sigmoid", "mse", "binary"), ("softmax", "mse", "onehot"),
     ("relu", "mse", "regression")],
)
def test_output_losses(activation, loss, kind) -> None:
    x, y = _data(7, 4, 3, kind, seed=1)
    net = Network([Dense(5, activation="tanh"), Output(3, activation=activation, loss=loss)],
                  input_shape=(4,), seed=5, dtype="float64")
    _check_gradient(net, x, y)


@pytest.mark.parametrize("mask", [np.array([1.0, 0.0, 1.0, 0.5, 1.0]), "per_output"])
def test_masked_loss(mask) -> None:
    x, y = _data(5, 4, 3, "onehot", seed=2)
    if isinstance(mask, str):
        mask = (np.random.default_rng(0).random((5, 3)) > 0.3).astype(float)
        layers = [Dense(3, "tanh"), Output(3, "sigmoid", "xent")]
        net = Network(layers, input_shape=(4,), seed=1, dtype="float64")
    else:
        net = Network([Dense(3, "tanh"), Output(3)], input_shape=(4,), seed=1, dtype="float64")
    _check_gradient(net, x, y, mask)
    # a zero-weight example changes nothing
    g1, _ = net.compute_gradient(x, y, mask)
    y2 = y.copy()
    if mask.ndim == 1:
        y2[1] = np.roll(y2[1], 1)
        g2, _ = net.compute_gradient(x, y2, mask)
        np.testing.assert_allclose(g1, g2)


def test_l2_regularization() -> None:
    x, y = _data(6, 4, 3, "onehot", seed=4)
    net = Network([Dense(5, "relu"), Output(3)], input_shape=(4,), seed=2, dtype="float64", l2=0.3)
    _check_gradient(net, x, y)
    plain = Network.from_config({**net.get_config(), "l2": 0.0})
    plain.set_params(net.params)
    g_l2, loss_l2 = net.compute_gradient(x, y)
    g0, loss0 = plain.compute_gradient(x, y)
    w = net.layers[0].params["W"]
    assert loss_l2 > loss0
    # biases are not regularized
    n_w = w.size
    np.testing.assert_allclose(g_l2[:n_w] - g0[:n_w], 0.3 * w.ravel())
    np.testing.assert_allclose(g_l2[n_w : n_w + 5], g0[n_w : n_w + 5])


def test_dropout_gradient_with_fixed_mask() -> None:
    x, y = _data(6, 5, 3, "onehot", seed=6)
    net = Network([Dense(8, "tanh"), Dropout(0.4), Output(3)], input_shape=(5,), seed=9, dtype="float64")
    _check_gradient(net, x, y)
    # inference is deterministic and not scaled
    np.testing.assert_array_equal(net.output(x), net.output(x))


def test_conv_pool_flatten() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 7, 7))
    y = np.eye(3)[[0, 2, 1]]
    net = Network(
        [Conv2D(3, kernel_size=3, padding=1, activation="tanh"), MaxPool2D(2),
         Conv2D(2, kernel_size=2, stride=1, activation="relu"), Flatten(), Output(3)],
        input_shape=(2, 7, 7), seed=4, dtype="float64",
    )
    _check_gradient(net, x, y)


def test_conv_stride_and_overlapping_pool() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 1, 9, 9))
    y = rng.normal(size=(2, 2))
    net = Network(
        [Conv2D(2, kernel_size=(3, 3), stride=2, activation="sigmoid"), MaxPool2D(3, stride=1),
         Dense(3, "tanh"), Output(2, "identity", "mse")],
        input_shape=(1, 9, 9), seed=1, dtype="float64",
    )
    _check_gradient(net, x, y)


def test_conv_matches_direct_convolution() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 3, 6, 5))
    net = Network([Conv2D(4, kernel_size=3, padding=1, activation="identity"), Flatten(),
                   Output(2, "identity", "mse")], input_shape=(3, 6, 5), seed=0, dtype="float64")
    layer = net.layers[0]
    out, _ = layer.forward(x, False, None)
    w, b = layer.params["W"], layer.params["b"]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((2, 4, 6, 5))
    for f in range(4):
        for i in range(6):
            for j in range(5):
                ref[:, f, i, j] = (xp[:, :, i : i + 3, j : j + 3] * w[f]).sum(axis=(1, 2, 3)) + b[f]
    np.testing.assert_allclose(out, ref, atol=1e-12)


@pytest.mark.parametrize("pool", [MaxPool2D(2), MaxPool2D((2, 2), stride=1)])
def test_pool_on_contiguous_input_with_remainder(pool) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 2, 5, 5))  # 5x5: the 2x2 tiles leave a row and a column out
    y = np.eye(3)[[1, 0, 2]]
    net = Network([pool, Dense(4, "tanh"), Output(3)], input_shape=(2, 5, 5), seed=2, dtype="float64")
    _check_gradient(net, x, y)
