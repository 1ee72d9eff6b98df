"""A sequential network whose parameters live in ONE flat vector.

Every layer's W and b are views into ``params`` and every gradient a view into one flat gradient
buffer, so the encoder reads and the decoder writes the parameters without copies. The updater's state
is one flat vector too (download it when joining, average it at the end).

    net = Network([Dense(64), Output(10)], input_shape=(64,), updater=Adam(1e-3), seed=42)
    update, loss = net.compute_update(x, y)   # forward + backward + updater; nothing applied
    net.apply_update(update)                  # params += update
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from psrv.nn import _inputs
from psrv.nn.errors import ConfigError, InvalidInputError, NonFiniteLossError
from psrv.nn.eval_classification import Evaluation
from psrv.nn.eval_regression import RegressionEvaluation
from psrv.nn.layers import Dropout, Layer, Output, layer_from_config
from psrv.nn.serialization import (
    load_network,
    network_from_bytes,
    network_to_bytes,
    register_network_type,
    save_network,
)
from psrv.nn.updaters import Adam, Updater, updater_from_config

CONFIG_FORMAT = "psrv.nn.Network"
CONFIG_VERSION = 1
_DTYPES = {"float32": np.float32, "float64": np.float64}


class Network(_inputs.TrainingCounters):
    """A sequential network (DL4J's MultiLayerNetwork) shaped for gradient sharing."""

    def __init__(
        self,
        layers: Sequence[Layer | dict[str, Any]],
        input_shape: Sequence[int] | int,
        updater: Updater | dict[str, Any] | None = None,
        seed: int | None = None,
        l2: float = 0.0,
        dtype: str = "float32",
    ) -> None:
        if isinstance(input_shape, int | np.integer):
            input_shape = (int(input_shape),)
        self.input_shape = tuple(int(s) for s in input_shape)
        if not self.input_shape or any(s <= 0 for s in self.input_shape):
            raise ConfigError(f"input_shape must be positive ints, got {input_shape!r}")
        if str(dtype) not in _DTYPES:
            raise ConfigError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.dtype = np.dtype(_DTYPES[str(dtype)])
        self.l2 = float(l2)
        if not math.isfinite(self.l2) or self.l2 < 0:
            raise ConfigError(f"l2 must be a finite number >= 0, got {l2!r}")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (2**31))
        self.seed = int(seed)

        # Fresh layer instances from their configurations: a user's layer objects are never shared.
        self.layers: list[Layer] = [
            layer_from_config(layer.get_config() if isinstance(layer, Layer) else layer) for layer in layers
        ]
        if not self.layers or not isinstance(self.layers[-1], Output):
            raise ConfigError("the last layer of a Network must be an Output layer")
        if any(isinstance(layer, Output) for layer in self.layers[:-1]):
            raise ConfigError("only the last layer of a Network may be an Output layer")
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.build(shape)
        self.output_layer: Output = self.layers[-1]  # type: ignore[assignment]
        self.num_outputs = self.output_layer.units

        specs = [(layer, name, shp) for layer in self.layers for name, shp in layer.param_specs()]
        total = sum(int(np.prod(shp)) for _, _, shp in specs)
        self._params = np.zeros(total, dtype=self.dtype)
        self._grads = np.zeros(total, dtype=self.dtype)
        self._regularized: list[tuple[np.ndarray, np.ndarray]] = []
        offset = 0
        views: dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {
            id(layer): ({}, {}) for layer in self.layers
        }
        for layer, name, shp in specs:
            size = int(np.prod(shp))
            p = self._params[offset : offset + size].reshape(shp)
            g = self._grads[offset : offset + size].reshape(shp)
            views[id(layer)][0][name] = p
            views[id(layer)][1][name] = g
            if name in layer.regularized:
                self._regularized.append((p, g))
            offset += size
        for layer in self.layers:
            layer.bind(*views[id(layer)])
        rng = np.random.default_rng(self.seed)
        for layer in self.layers:
            layer.init_params(rng)

        self.updater: Updater = updater_from_config(updater if updater is not None else Adam(1e-3))
        self._updater_state = np.zeros(self.updater.state_size(total), dtype=self.dtype)
        self._iteration = 0
        self._epoch = 0
        self._has_dropout = any(isinstance(layer, Dropout) for layer in self.layers)
        self.normalizer: Any = None
        self.last_loss: float | None = None

    # --- the flat vectors ------------------------------------------------------------------------

    @property
    def params(self) -> np.ndarray:
        """The live flat parameter vector (layers hold views of it): modify in place, never rebind."""
        return self._params

    @property
    def num_params(self) -> int:
        return int(self._params.size)

    @property
    def gradients(self) -> np.ndarray:
        """The flat gradient buffer of the last compute_update/compute_gradient (live, overwritten)."""
        return self._grads

    def set_params(self, params: np.ndarray) -> None:
        """Copy a flat vector into the parameters (the views stay valid)."""
        self._params[...] = self._check_flat(params, self.num_params, "params")

    @property
    def updater_state(self) -> np.ndarray:
        """The live flat updater state vector (size = slots * num_params)."""
        return self._updater_state

    def set_updater_state(self, state: np.ndarray) -> None:
        self._updater_state[...] = self._check_flat(state, self._updater_state.size, "updater state")

    def _check_flat(self, vec: Any, size: int, what: str) -> np.ndarray:
        arr = np.asarray(vec)
        if arr.shape != (size,):
            raise InvalidInputError(
                f"{what}: expected a flat vector of shape ({size},), got shape {arr.shape}"
            )
        if arr.dtype.kind != "f":
            raise InvalidInputError(f"{what}: expected a float vector, got dtype {arr.dtype}")
        return arr

    # --- training steps ---------------------------------------------------------------------------

    def _prepare(self, features: Any, labels: Any, mask: Any) -> tuple[np.ndarray, np.ndarray, Any]:
        x = _inputs.prepare_features(features, self.input_shape, self.dtype)
        loss = self.output_layer.loss
        y = _inputs.prepare_labels(
            labels, x.shape[0], self.num_outputs, self.dtype, loss.probability_labels, loss.name == "mcxent"
        )
        m = _inputs.prepare_mask(mask, x.shape[0], self.num_outputs, self.dtype)
        return x, y, m

    def _forward(self, x: np.ndarray, training: bool) -> tuple[np.ndarray, list[Any]]:
        rng = None
        if training and self._has_dropout:
            # one reproducible stream per (seed, iteration): a gradient recomputed at the same
            # iteration sees the same dropout masks
            rng = np.random.default_rng([self.seed, self._iteration])
        caches = []
        for layer in self.layers:
            x, cache = layer.forward(x, training, rng)
            caches.append(cache)
        return x, caches

    def _l2_penalty(self) -> float:
        if not self.l2:
            return 0.0
        return 0.5 * self.l2 * float(sum(np.vdot(p, p) for p, _ in self._regularized))

    def _gradient(self, x: np.ndarray, y: np.ndarray, mask: Any) -> float:
        """Forward + backward into the flat gradient buffer; returns the loss (with the L2 term)."""
        _, caches = self._forward(x, training=True)
        data_loss, delta = self.output_layer.loss_and_delta(caches[-1], y, mask)
        loss = data_loss + self._l2_penalty()
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"loss is {loss} at iteration {self._iteration}: training diverged (lower the learning rate?)"
            )
        dy = self.output_layer.backward_from_delta(delta, caches[-1], need_dx=len(self.layers) > 1)
        for i in range(len(self.layers) - 2, -1, -1):
            dy = self.layers[i].backward(dy, caches[i], need_dx=i > 0)
        if self.l2:
            for p, g in self._regularized:
                g += self.l2 * p
        return loss

    def compute_gradient(self, features: Any, labels: Any, mask: Any = None) -> tuple[np.ndarray, float]:
        """(a copy of the raw gradient incl. L2, loss); no updater, no counter change."""
        x, y, m = self._prepare(features, labels, mask)
        loss = self._gradient(x, y, m)
        return self._grads.copy(), loss

    def compute_update(self, features: Any, labels: Any, mask: Any = None) -> tuple[np.ndarray, float]:
        """Forward, backward and the updater: returns (the step to ADD to params, the loss).

        Nothing is applied; the updater state advances and ``iteration`` grows by one. Bad input raises
        InvalidInputError and a diverged loss NonFiniteLossError, both before any state changes.
        """
        x, y, m = self._prepare(features, labels, mask)
        loss = self._gradient(x, y, m)
        update = np.empty_like(self._params)
        self.updater.compute(self._grads, self._updater_state, self._iteration, self._epoch, update)
        self._iteration += 1
        self.last_loss = loss
        return update, loss

    def apply_update(self, update: np.ndarray) -> None:
        """params += update (in place; the layer views see it at once)."""
        self._params += self._check_flat(update, self.num_params, "update")

    # --- inference --------------------------------------------------------------------------------

    def output(self, features: Any, batch_size: int = 4096) -> np.ndarray:
        """Activations of the output layer (inference mode: no dropout)."""
        x = _inputs.prepare_features(features, self.input_shape, self.dtype)
        if x.shape[0] <= batch_size:
            return self._forward(x, training=False)[0]
        return np.concatenate(
            [
                self._forward(x[i : i + batch_size], training=False)[0]
                for i in range(0, x.shape[0], batch_size)
            ]
        )

    def predict(self, features: Any) -> np.ndarray:
        """Class indices (argmax; for one sigmoid output, p >= 0.5)."""
        out = self.output(features)
        if out.shape[1] == 1 and self.output_layer.activation.name == "sigmoid":
            return (out[:, 0] >= 0.5).astype(np.int64)
        return out.argmax(axis=1)

    def score(self, data: Any, batch_size: int = 4096) -> float:
        """Mean loss per example over a DataSet / iterable of DataSets (inference mode, with L2 term)."""
        total, count = 0.0, 0
        for features, labels, mask in _inputs.minibatches(data, batch_size, None):
            x, y, m = self._prepare(features, labels, mask)
            out, caches = self._forward(x, training=False)
            loss, _ = self.output_layer.loss_and_delta(caches[-1], y, m)
            total += loss * x.shape[0]
            count += x.shape[0]
        if count == 0:
            raise InvalidInputError("score: expected at least one example, got none")
        return total / count + self._l2_penalty()

    def fit(
        self,
        data: Any,
        epochs: int = 1,
        batch_size: int = 32,
        shuffle: bool = True,
    ) -> None:
        """Single-process training: compute_update + apply_update per minibatch, ``epoch`` += 1 per pass.

        ``data`` is a DataSet (sliced into minibatches, reshuffled each epoch when ``shuffle``) or an
        iterable of DataSets (each one minibatch, as DL4J's fit(iterator)); a one-shot iterator allows
        one epoch only.
        """
        _inputs.fit_epochs(self, data, epochs, batch_size, shuffle)

    def evaluate(self, data: Any, evaluation: Any = None, batch_size: int = 4096) -> Any:
        """Evaluate on a DataSet / iterable of DataSets. Default: Evaluation for classifiers (softmax or
        sigmoid), RegressionEvaluation for mse outputs; pass ``evaluation`` (e.g. ROC()) to use another."""
        binary = self.num_outputs == 1 and self.output_layer.activation.name == "sigmoid"
        if evaluation is None:
            if self.output_layer.loss.name == "mse":
                evaluation = RegressionEvaluation()
            else:
                evaluation = Evaluation(num_classes=2 if binary else self.num_outputs)
        classify = isinstance(evaluation, Evaluation)
        for features, labels, mask in _inputs.minibatches(data, batch_size, None):
            x, y, m = self._prepare(features, labels, mask)
            out = self._forward(x, training=False)[0]
            if binary and classify:
                out = np.concatenate([1 - out, out], axis=1)
                y = np.concatenate([1 - y, y], axis=1)
            evaluation.eval(y, out, mask=m)
        return evaluation

    # --- configuration, copies, files ----------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        """Plain JSON-able data that rebuilds this architecture (not its trained values)."""
        return {
            "format": CONFIG_FORMAT,
            "format_version": CONFIG_VERSION,
            "input_shape": list(self.input_shape),
            "layers": [layer.get_config() for layer in self.layers],
            "updater": self.updater.get_config(),
            "seed": self.seed,
            "l2": self.l2,
            "dtype": str(self.dtype),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Network:
        if not isinstance(config, dict) or config.get("format") != CONFIG_FORMAT:
            raise ConfigError(
                f"not a Network configuration (expected format {CONFIG_FORMAT!r}): {config!r:.200}"
            )
        if int(config.get("format_version", 0)) > CONFIG_VERSION:
            raise ConfigError(
                f"configuration version {config.get('format_version')} is newer than"
                f" supported {CONFIG_VERSION}"
            )
        try:
            return cls(
                layers=config["layers"],
                input_shape=config["input_shape"],
                updater=config["updater"],
                seed=config["seed"],
                l2=config.get("l2", 0.0),
                dtype=config.get("dtype", "float32"),
            )
        except KeyError as exc:
            raise ConfigError(f"Network configuration misses key {exc}") from exc

    def clone(self) -> Network:
        """An independent copy: configuration, parameters, updater state, counters, normalizer."""
        other = Network.from_config(self.get_config())
        other.set_params(self._params)
        other.set_updater_state(self._updater_state)
        other._iteration, other._epoch = self._iteration, self._epoch
        other.normalizer = copy.deepcopy(self.normalizer)
        return other

    def save(self, path: Any) -> None:
        """One versioned file: configuration, parameters, updater state, counters, normalizer."""
        save_network(self, path)

    @classmethod
    def load(cls, path: Any) -> Network:
        return load_network(path)

    def to_bytes(self) -> bytes:
        return network_to_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Network:
        return network_from_bytes(data)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # pickling (Spark closures, broadcasts, deepcopy) goes through the file form, so the layer
        # views of the unpickled copy point into its own flat vector again
        return (Network.from_bytes, (self.to_bytes(),))

    def summary(self) -> str:
        lines = [f"Network: input {self.input_shape}, {self.num_params} parameters, updater {self.updater!r}"]
        for i, layer in enumerate(self.layers):
            n = sum(int(np.prod(s)) for _, s in layer.param_specs())
            lines.append(f"  {i}: {layer!r} -> {layer.output_shape} ({n} params)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"Network(layers={len(self.layers)}, num_params={self.num_params},"
            f" input_shape={self.input_shape})"
        )


register_network_type(CONFIG_FORMAT, Network.from_config)


__all__ = [
    "CONFIG_FORMAT",
    "CONFIG_VERSION",
    "Network",
]
