"""Layers of a sequential network. Each layer's parameters and gradients are views into the network's
flat buffers (bound by the network), so nothing is ever copied between a layer and the flat vector.

A layer is configured by plain data (``get_config()`` / ``layer_from_config()``); the network builds its
own instances from those configurations.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from psrv.nn import conv
from psrv.nn.activations import Activation, get_activation
from psrv.nn.errors import ConfigError
from psrv.nn.init import check_scheme, init_weights
from psrv.nn.losses import Loss, default_loss_for, get_loss
from psrv.nn.named import build_named

Shape = tuple[int, ...]


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return int(value)


def _default_init(activation: Activation) -> str:
    return "he" if activation.name in ("relu", "leakyrelu") else "xavier"


class Layer:
    """Base class. Lifecycle: build(input_shape) -> param_specs() -> bind(views) -> init_params(rng)."""

    kind: ClassVar[str] = ""
    #: names of parameters that L2 regularization applies to (weights, not biases)
    regularized: ClassVar[tuple[str, ...]] = ()

    input_shape: Shape = ()
    output_shape: Shape = ()

    def build(self, input_shape: Shape) -> Shape:
        self.input_shape = tuple(int(s) for s in input_shape)
        self.output_shape = self._output_shape(self.input_shape)
        return self.output_shape

    def _output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def param_specs(self) -> list[tuple[str, Shape]]:
        return []

    def bind(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.params = params
        self.grads = grads

    def init_params(self, rng: np.random.Generator) -> None:
        pass

    def forward(
        self, x: np.ndarray, training: bool, rng: np.random.Generator | None
    ) -> tuple[np.ndarray, Any]:
        raise NotImplementedError

    def backward(self, dy: np.ndarray, cache: Any, need_dx: bool = True) -> np.ndarray | None:
        """Write parameter gradients into the bound grad views; return dLoss/dx (or None)."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        return {"type": self.kind}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "type")
        return f"{type(self).__name__}({args})"


class Dense(Layer):
    """Fully connected: a = f(x W + b). Input of more than one dimension per example is flattened."""

    kind = "dense"
    regularized = ("W",)

    def __init__(
        self,
        units: int,
        activation: str | dict = "relu",
        weight_init: str | None = None,
        bias_init: float = 0.0,
    ) -> None:
        self.units = _positive_int(units, f"{type(self).__name__} units")
        self.activation = get_activation(activation)
        self.weight_init = check_scheme(weight_init) if weight_init else _default_init(self.activation)
        self.bias_init = float(bias_init)

    def _output_shape(self, input_shape: Shape) -> Shape:
        self.n_in = int(np.prod(input_shape))
        return (self.units,)

    def param_specs(self) -> list[tuple[str, Shape]]:
        return [("W", (self.n_in, self.units)), ("b", (self.units,))]

    def init_params(self, rng: np.random.Generator) -> None:
        init_weights(self.params["W"], self.weight_init, self.n_in, self.units, rng)
        self.params["b"][...] = self.bias_init

    def forward(self, x, training, rng):
        x2 = x.reshape(x.shape[0], -1) if x.ndim != 2 else x
        z = x2 @ self.params["W"]
        z += self.params["b"]
        a = self.activation.forward(z)
        return a, (x2, z, a, x.shape)

    def backward(self, dy, cache, need_dx=True):
        x2, z, a, _ = cache
        return self._backward_linear(self.activation.backward(dy, z, a), cache, need_dx)

    def _backward_linear(self, dz: np.ndarray, cache: Any, need_dx: bool) -> np.ndarray | None:
        x2, _, _, x_shape = cache
        np.matmul(x2.T, dz, out=self.grads["W"])
        np.sum(dz, axis=0, out=self.grads["b"])
        if not need_dx:
            return None
        dx = dz @ self.params["W"].T
        return dx.reshape(x_shape) if len(x_shape) != 2 else dx

    def get_config(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "units": self.units,
            "activation": self.activation.get_config(),
            "weight_init": self.weight_init,
            "bias_init": self.bias_init,
        }


class Output(Dense):
    """The last layer: a dense layer with a loss (softmax+mcxent, sigmoid+xent, any activation+mse)."""

    kind = "output"

    def __init__(
        self,
        units: int,
        activation: str | dict = "softmax",
        loss: str | None = None,
        weight_init: str | None = None,
        bias_init: float = 0.0,
    ) -> None:
        super().__init__(units, activation, weight_init or "xavier", bias_init)
        self.loss: Loss = get_loss(loss or default_loss_for(self.activation.name), self.activation)

    def loss_and_delta(
        self, cache: Any, labels: np.ndarray, mask: np.ndarray | None
    ) -> tuple[float, np.ndarray]:
        _, z, a, _ = cache
        return self.loss.loss_and_delta(z, a, labels, mask, self.activation)

    def backward_from_delta(self, dz: np.ndarray, cache: Any, need_dx: bool = True) -> np.ndarray | None:
        return self._backward_linear(dz, cache, need_dx)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["loss"] = self.loss.name
        return config


class Dropout(Layer):
    """Inverted dropout: in training each input is zeroed with probability ``rate`` and the rest scaled
    by 1/(1-rate); at inference the layer is the identity."""

    kind = "dropout"

    def __init__(self, rate: float = 0.5) -> None:
        if not 0.0 <= float(rate) < 1.0:
            raise ConfigError(f"Dropout rate must be in [0, 1), got {rate!r}")
        self.rate = float(rate)

    def forward(self, x, training, rng):
        if not training or self.rate == 0.0:
            return x, None
        if rng is None:
            raise ConfigError("Dropout in training needs a random generator")
        keep = rng.random(x.shape, dtype=np.float64 if x.dtype == np.float64 else np.float32) >= self.rate
        scale = np.multiply(keep, x.dtype.type(1.0 / (1.0 - self.rate)), dtype=x.dtype)
        return x * scale, scale

    def backward(self, dy, cache, need_dx=True):
        return dy if cache is None else dy * cache

    def get_config(self) -> dict[str, Any]:
        return {"type": self.kind, "rate": self.rate}


class Flatten(Layer):
    """(N, C, H, W) -> (N, C*H*W)."""

    kind = "flatten"

    def _output_shape(self, input_shape: Shape) -> Shape:
        return (int(np.prod(input_shape)),)

    def forward(self, x, training, rng):
        return x.reshape(x.shape[0], -1), x.shape

    def backward(self, dy, cache, need_dx=True):
        return dy.reshape(cache)


def _pair(value: Any, what: str) -> tuple[int, int]:
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise ConfigError(f"{what} must be an int or a pair, got {value!r}")
        return _positive_int(value[0], what), _positive_int(value[1], what)
    v = _positive_int(value, what)
    return v, v


class Conv2D(Layer):
    """2-D convolution over NCHW images by im2col + one matrix product. ``padding`` is an int or "same"
    (stride 1, odd kernel); W has shape (filters, channels, kh, kw)."""

    kind = "conv2d"
    regularized = ("W",)

    def __init__(
        self,
        filters: int,
        kernel_size: int | tuple[int, int] = 5,
        stride: int = 1,
        padding: int | str = 0,
        activation: str | dict = "relu",
        weight_init: str | None = None,
        bias_init: float = 0.0,
    ) -> None:
        self.filters = _positive_int(filters, "Conv2D filters")
        self.kh, self.kw = _pair(kernel_size, "Conv2D kernel_size")
        self.stride = _positive_int(stride, "Conv2D stride")
        if padding == "same":
            if self.stride != 1 or self.kh % 2 == 0 or self.kw % 2 == 0 or self.kh != self.kw:
                raise ConfigError("Conv2D padding='same' needs stride 1 and a square odd kernel")
            self.pad = self.kh // 2
        elif isinstance(padding, int | np.integer) and not isinstance(padding, bool) and padding >= 0:
            self.pad = int(padding)
        else:
            raise ConfigError(f"Conv2D padding must be an int >= 0 or 'same', got {padding!r}")
        self.padding = padding
        self.activation = get_activation(activation)
        self.weight_init = check_scheme(weight_init) if weight_init else _default_init(self.activation)
        self.bias_init = float(bias_init)

    def _output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise ConfigError(f"Conv2D needs (channels, height, width) input, got shape {input_shape}")
        c, h, w = input_shape
        oh = conv.output_size(h, self.kh, self.stride, self.pad)
        ow = conv.output_size(w, self.kw, self.stride, self.pad)
        if oh <= 0 or ow <= 0:
            raise ConfigError(
                f"Conv2D kernel {self.kh}x{self.kw} (padding {self.pad}) does not fit input {h}x{w}"
            )
        self.channels = c
        return (self.filters, oh, ow)

    def param_specs(self) -> list[tuple[str, Shape]]:
        return [("W", (self.filters, self.channels, self.kh, self.kw)), ("b", (self.filters,))]

    def init_params(self, rng: np.random.Generator) -> None:
        area = self.kh * self.kw
        init_weights(self.params["W"], self.weight_init, self.channels * area, self.filters * area, rng)
        self.params["b"][...] = self.bias_init

    def forward(self, x, training, rng):
        n = x.shape[0]
        _, oh, ow = self.output_shape
        cols = conv.im2col(x, self.kh, self.kw, self.stride, self.pad)  # (C*kh*kw, N*OH*OW)
        z = self.params["W"].reshape(self.filters, -1) @ cols  # (F, N*OH*OW)
        z += self.params["b"][:, None]
        z = z.reshape(self.filters, n, oh, ow).transpose(1, 0, 2, 3)  # NCHW view, channel-major memory
        a = self.activation.forward(z)
        return a, (cols, z, a, x.shape)

    def backward(self, dy, cache, need_dx=True):
        cols, z, a, x_shape = cache
        dz = self.activation.backward(dy, z, a)
        d2 = dz.transpose(1, 0, 2, 3).reshape(self.filters, -1)  # free when dz kept channel-major
        np.matmul(d2, cols.T, out=self.grads["W"].reshape(self.filters, -1))
        np.sum(d2, axis=1, out=self.grads["b"])
        if not need_dx:
            return None
        dcols = self.params["W"].reshape(self.filters, -1).T @ d2
        return conv.col2im(dcols, x_shape, self.kh, self.kw, self.stride, self.pad)

    def get_config(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "filters": self.filters,
            "kernel_size": [self.kh, self.kw],
            "stride": self.stride,
            "padding": self.padding,
            "activation": self.activation.get_config(),
            "weight_init": self.weight_init,
            "bias_init": self.bias_init,
        }


class MaxPool2D(Layer):
    """Max pooling over NCHW images (no padding; windows that do not fit are dropped)."""

    kind = "maxpool2d"

    def __init__(self, pool_size: int | tuple[int, int] = 2, stride: int | None = None) -> None:
        self.ph, self.pw = _pair(pool_size, "MaxPool2D pool_size")
        self.stride = _positive_int(stride, "MaxPool2D stride") if stride is not None else self.ph

    def _output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise ConfigError(f"MaxPool2D needs (channels, height, width) input, got shape {input_shape}")
        c, h, w = input_shape
        oh, ow = conv.output_size(h, self.ph, self.stride, 0), conv.output_size(w, self.pw, self.stride, 0)
        if oh <= 0 or ow <= 0:
            raise ConfigError(f"MaxPool2D window {self.ph}x{self.pw} does not fit input {h}x{w}")
        return (c, oh, ow)

    def _tiles(self) -> bool:
        """Non-overlapping windows (stride == pool size): the fast reshape path."""
        return self.stride == self.ph == self.pw

    def forward(self, x, training, rng):
        # pooling treats N and C alike: work in whichever order is contiguous in memory (a conv layer
        # hands over channel-major data), so the reshapes below stay free
        swap = not x.flags.c_contiguous and x.transpose(1, 0, 2, 3).flags.c_contiguous
        xx = x.transpose(1, 0, 2, 3) if swap else x
        a, b = xx.shape[:2]
        _, oh, ow = self.output_shape
        if self._tiles():
            p = self.ph
            flat = (
                xx[:, :, : oh * p, : ow * p]
                .reshape(a, b, oh, p, ow, p)
                .transpose(0, 1, 2, 4, 3, 5)
                .reshape(a, b, oh, ow, p * p)
            )
        else:
            win = conv.windows(xx, self.ph, self.pw, self.stride, 0)
            flat = win.reshape(a, b, oh, ow, self.ph * self.pw)
        idx = flat.argmax(axis=-1)
        y = np.take_along_axis(flat, idx[..., None], axis=-1)[..., 0]
        return (y.transpose(1, 0, 2, 3) if swap else y), (idx, xx.shape, swap)

    def backward(self, dy, cache, need_dx=True):
        idx, x_shape, swap = cache
        if swap:
            dy = dy.transpose(1, 0, 2, 3)
        dx = self._backward(dy, idx, x_shape)
        return dx.transpose(1, 0, 2, 3) if swap else dx

    def _backward(self, dy: np.ndarray, idx: np.ndarray, x_shape: tuple[int, ...]) -> np.ndarray:
        n, c, h, w = x_shape
        oh, ow = idx.shape[2:]
        if self._tiles():
            p = self.ph
            dwin = np.zeros((n, c, oh, ow, p * p), dtype=dy.dtype)
            np.put_along_axis(dwin, idx[..., None], dy[..., None], axis=-1)
            tiles = dwin.reshape(n, c, oh, ow, p, p).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, oh * p, ow * p)
            if oh * p == h and ow * p == w:
                return tiles
            dx = np.zeros(x_shape, dtype=dy.dtype)
            dx[:, :, : oh * p, : ow * p] = tiles
            return dx
        dx = np.zeros(x_shape, dtype=dy.dtype)
        h_span, w_span = self.stride * (oh - 1) + 1, self.stride * (ow - 1) + 1
        for i in range(self.ph):
            for j in range(self.pw):
                hit = idx == i * self.pw + j
                dx[:, :, i : i + h_span : self.stride, j : j + w_span : self.stride] += np.where(hit, dy, 0)
        return dx

    def get_config(self) -> dict[str, Any]:
        return {"type": self.kind, "pool_size": [self.ph, self.pw], "stride": self.stride}


LAYER_TYPES: dict[str, type[Layer]] = {
    cls.kind: cls for cls in (Dense, Output, Dropout, Flatten, Conv2D, MaxPool2D)
}


def layer_from_config(config: dict[str, Any]) -> Layer:
    if not isinstance(config, dict) or "type" not in config:
        raise ConfigError(f"a layer configuration is a dict with a 'type', got {config!r}")
    kwargs = dict(config)
    kind = kwargs.pop("type")
    return build_named(LAYER_TYPES, kind, kwargs, "layer type")


__all__ = [
    "Conv2D",
    "Dense",
    "Dropout",
    "Flatten",
    "LAYER_TYPES",
    "Layer",
    "MaxPool2D",
    "Output",
    "Shape",
    "layer_from_config",
]
