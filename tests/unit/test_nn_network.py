"""Network contract: flat views, compute/apply update, bad input leaves state untouched, config, save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from psrv.nn import (
    Conv2D,
    Dense,
    Dropout,
    ForeignFileError,
    InvalidInputError,
    MaxPool2D,
    Nesterov,
    Network,
    NonFiniteLossError,
    Output,
    Sgd,
    TruncatedFileError,
    UnsupportedVersionError,
)
from psrv.nn.errors import ConfigError, NNError


def _mlp(**kw) -> Network:
    return Network([Dense(16, "relu"), Dropout(0.2), Output(4)], input_shape=(6,), seed=11, **kw)


def _batch(n: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 4, n)


def test_params_are_one_flat_vector_backing_every_layer() -> None:
    net = _mlp()
    assert net.params.dtype == np.float32 and net.params.ndim == 1
    assert net.num_params == 6 * 16 + 16 + 16 * 4 + 4
    for layer in net.layers:
        for view in getattr(layer, "params", {}).values():
            assert np.shares_memory(view, net.params)
    net.params[:] = 0.5
    assert np.all(net.layers[0].params["W"] == 0.5)
    assert np.shares_memory(net.gradients, net.gradients) and net.gradients.size == net.num_params


def test_seed_makes_init_reproducible() -> None:
    a, b, c = _mlp(), _mlp(), Network([Dense(16), Dropout(0.2), Output(4)], input_shape=(6,), seed=12)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    x, y = _batch()
    ua, la = a.compute_update(x, y)
    ub, lb = b.compute_update(x, y)
    np.testing.assert_array_equal(ua, ub)
    assert la == lb


def test_compute_update_does_not_apply() -> None:
    net = _mlp(updater=Nesterov(0.1))
    x, y = _batch()
    before = net.params.copy()
    update, loss = net.compute_update(x, y)
    np.testing.assert_array_equal(net.params, before)
    assert update.shape == (net.num_params,) and update.dtype == np.float32
    assert np.isfinite(loss) and loss > 0
    assert net.iteration == 1 and np.any(net.updater_state != 0)
    net.apply_update(update)
    np.testing.assert_allclose(net.params, before + update)


def test_training_steps_lower_the_loss() -> None:
    net = Network([Dense(16, "tanh"), Output(4)], input_shape=(6,), seed=1, updater=Sgd(0.5))
    x, y = _batch(32)
    first = net.score((x, y))
    for _ in range(50):
        update, _ = net.compute_update(x, y)
        net.apply_update(update)
    assert net.score((x, y)) < 0.5 * first


@pytest.mark.parametrize(
    ("features", "labels", "mask", "message"),
    [
        (np.zeros((4, 5)), np.array([0, 1, 2, 3]), None, "expected shape (n, 6), got shape (4, 5)"),
        (np.zeros((0, 6)), np.zeros(0, dtype=int), None, "non-empty batch"),
        (np.full((4, 6), np.nan), np.array([0, 1, 2, 3]), None, "NaN"),
        (np.zeros((4, 6)), np.array([0, 1, 2, 4]), None, "class indices in [0, 3]"),
        (np.zeros((4, 6)), np.array([0, 1, 2]), None, "expected 4 class indices"),
        (np.zeros((4, 6)), np.zeros((4, 3)), None, "expected shape (4, 4)"),
        (np.zeros((4, 6)), np.full((4, 4), 2.0), None, "values in [0, 1]"),
        (np.zeros((4, 6)), np.array([0, 1, 2, 3]), np.ones(3), "mask: expected shape"),
        (np.zeros((4, 6)), np.array([0, 1, 2, 3]), -np.ones(4), "mask: expected values >= 0"),
        ("text", np.array([0]), None, "numeric array"),
    ],
)
def test_bad_input_is_rejected_and_changes_nothing(features, labels, mask, message) -> None:
    net = _mlp()
    x, y = _batch()
    net.apply_update(net.compute_update(x, y)[0])
    params, state, it = net.params.copy(), net.updater_state.copy(), net.iteration
    with pytest.raises(InvalidInputError) as info:
        net.compute_update(features, labels, mask)
    assert message in str(info.value)
    assert isinstance(info.value, NNError) and isinstance(info.value, ValueError)
    np.testing.assert_array_equal(net.params, params)
    np.testing.assert_array_equal(net.updater_state, state)
    assert net.iteration == it


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_diverged_loss_raises_before_any_change() -> None:
    net = Network([Dense(4, "identity"), Output(2, "identity", "mse")], input_shape=(6,), seed=0)
    net.params[:] = 1e30
    params, state = net.params.copy(), net.updater_state.copy()
    with pytest.raises(NonFiniteLossError):
        net.compute_update(np.ones((2, 6)), np.zeros((2, 2)))
    np.testing.assert_array_equal(net.params, params)
    np.testing.assert_array_equal(net.updater_state, state)
    assert net.iteration == 0


def test_apply_update_and_setters_check_shapes() -> None:
    net = _mlp()
    with pytest.raises(InvalidInputError, match=f"shape \\({net.num_params},\\)"):
        net.apply_update(np.zeros(3, dtype=np.float32))
    with pytest.raises(InvalidInputError):
        net.set_updater_state(np.zeros(net.updater_state.size + 1, dtype=np.float32))
    with pytest.raises(InvalidInputError):
        net.iteration = -1


def test_output_predict_and_image_features() -> None:
    net = Network([Conv2D(2, 3, padding="same"), MaxPool2D(2), Dense(8), Output(3)], input_shape=(1, 4, 4),
                  seed=0)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(5, 1, 4, 4))
    out = net.output(images)
    assert out.shape == (5, 3)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
    # flat (n, C*H*W) rows are accepted for image inputs
    np.testing.assert_array_equal(net.output(images.reshape(5, 16)), out)
    np.testing.assert_array_equal(net.predict(images), out.argmax(axis=1))


def test_config_is_json_and_round_trips() -> None:
    net = Network([Conv2D(3, 3), MaxPool2D(2), Dense(8, {"name": "leakyrelu", "alpha": 0.1}), Dropout(0.3),
                   Output(2, "sigmoid", "xent")], input_shape=(1, 6, 6), seed=5, l2=1e-4,
                  updater=Nesterov(0.01, 0.8))
    config = json.loads(json.dumps(net.get_config()))
    again = Network.from_config(config)
    assert again.get_config() == net.get_config()
    np.testing.assert_array_equal(again.params, net.params)  # same seed -> same init


@pytest.mark.parametrize(
    "layers",
    [[Dense(4)], [Output(2), Output(2)], [{"type": "dense"}, Output(2)], [{"type": "bogus"}, Output(2)],
     [{"type": "dense", "units": 4, "activation": "swish"}, Output(2)],
     [Dense(4), {"type": "output", "units": 2, "activation": "identity", "loss": "mcxent"}],
     [Conv2D(2, 9), Output(2)]],
)
def test_bad_config_is_rejected(layers) -> None:
    with pytest.raises(ConfigError):
        Network(layers, input_shape=(1, 4, 4))


def test_clone_is_independent() -> None:
    net = _mlp()
    x, y = _batch()
    net.apply_update(net.compute_update(x, y)[0])
    twin = net.clone()
    np.testing.assert_array_equal(twin.params, net.params)
    np.testing.assert_array_equal(twin.updater_state, net.updater_state)
    assert twin.iteration == net.iteration
    twin.params[:] = 0
    assert np.any(net.params != 0)


def test_save_load_gives_identical_outputs_and_state(tmp_path) -> None:
    net = _mlp(l2=1e-3)
    x, y = _batch(16)
    net.fit((x, y), epochs=2, batch_size=4)
    path = tmp_path / "net.psrvnn"
    net.save(path)
    loaded = Network.load(path)
    np.testing.assert_array_equal(loaded.output(x), net.output(x))
    np.testing.assert_array_equal(loaded.updater_state, net.updater_state)
    assert (loaded.iteration, loaded.epoch) == (net.iteration, net.epoch) == (8, 2)
    assert loaded.get_config() == net.get_config()
    # the next training step is identical too
    u1, l1 = net.compute_update(x, y)
    u2, l2 = loaded.compute_update(x, y)
    np.testing.assert_array_equal(u1, u2)
    assert l1 == l2
    assert Network.from_bytes(net.to_bytes()).get_config() == net.get_config()


def test_truncated_foreign_and_newer_files_are_clear_errors(tmp_path) -> None:
    net = _mlp()
    data = net.to_bytes()
    for cut in (3, 12, 40, len(data) - 1):
        with pytest.raises(TruncatedFileError, match="truncated"):
            Network.from_bytes(data[:cut])
    path = tmp_path / "foreign.bin"
    path.write_bytes(b"PK\x03\x04 this is a zip file, not a network")
    with pytest.raises(ForeignFileError, match="not a psrv network file"):
        Network.load(path)
    newer = bytearray(data)
    newer[8] = 99
    with pytest.raises(UnsupportedVersionError, match="version 99"):
        Network.from_bytes(bytes(newer))
    corrupt = bytearray(data)
    corrupt[-5] ^= 0xFF
    with pytest.raises(TruncatedFileError, match="checksum"):
        Network.from_bytes(bytes(corrupt))
    with pytest.raises(NNError, match="cannot read"):
        Network.load(tmp_path / "missing")


def test_fit_score_evaluate_with_dataset_and_normalizer_saved(tmp_path) -> None:
    from psrv.nn import DataSet, Standardize

    rng = np.random.default_rng(3)
    features = rng.normal(loc=5.0, scale=3.0, size=(64, 6)).astype(np.float32)
    labels = np.eye(4, dtype=np.float32)[(features[:, 0] > 5).astype(int) + 2 * (features[:, 1] > 5)]
    data = DataSet(features, labels)
    normalizer = Standardize().fit(data)
    data = normalizer.transform(data)
    net = Network([Dense(16, "relu"), Output(4)], input_shape=(6,), seed=0, updater=Nesterov(0.1))
    before = net.score(data)
    net.fit(data, epochs=20, batch_size=16)
    assert net.score(data) < before
    assert net.evaluate(data).accuracy() > 0.8
    # an iterable of DataSets is one minibatch each
    net.fit([data.subset(slice(0, 32)), data.subset(slice(32, 64))], epochs=2)
    assert net.epoch == 22
    net.normalizer = normalizer
    net.save(tmp_path / "n.psrvnn")
    loaded = Network.load(tmp_path / "n.psrvnn")
    assert isinstance(loaded.normalizer, Standardize)
    raw = DataSet(features, labels)
    np.testing.assert_allclose(loaded.normalizer.transform(raw).features, normalizer.transform(raw).features)
    np.testing.assert_array_equal(loaded.output(data.features), net.output(data.features))


def test_binary_and_regression_outputs_train_and_evaluate() -> None:
    from psrv.nn import ROC, Adam, RegressionEvaluation

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    y_binary = (x[:, 0] > 0).astype(np.float32)
    net = Network([Dense(8, "tanh"), Output(1, "sigmoid")], input_shape=3, seed=0, updater=Adam(0.01))
    assert net.output_layer.loss.name == "xent"
    net.fit((x, y_binary), epochs=20)
    assert net.evaluate((x, y_binary)).accuracy() > 0.95
    assert np.array_equal(net.predict(x), (net.output(x)[:, 0] >= 0.5).astype(int))
    assert net.evaluate((x, y_binary), evaluation=ROC()).auc() > 0.99
    y_reg = x @ np.array([[1.0], [2.0], [-1.0]], dtype=np.float32)
    reg = Network([Dense(8, "tanh"), Output(1, "identity")], input_shape=3, seed=0, updater=Adam(0.01))
    assert reg.output_layer.loss.name == "mse"
    before = reg.score((x, y_reg))
    reg.fit((x, y_reg), epochs=30)
    result = reg.evaluate((x, y_reg))
    assert isinstance(result, RegressionEvaluation)
    assert reg.score((x, y_reg)) < 0.1 * before


def test_pickle_and_deepcopy_keep_the_flat_views() -> None:
    import copy
    import pickle

    net = _mlp()
    x, y = _batch()
    net.apply_update(net.compute_update(x, y)[0])
    for twin in (pickle.loads(pickle.dumps(net)), copy.deepcopy(net)):
        np.testing.assert_array_equal(twin.output(x), net.output(x))
        assert twin.iteration == net.iteration
        for layer in twin.layers:
            for view in getattr(layer, "params", {}).values():
                assert np.shares_memory(view, twin.params)
        twin.params[:] = 0
        assert np.all(twin.layers[0].params["W"] == 0) and np.any(net.params != 0)
