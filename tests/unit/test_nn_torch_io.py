"""TorchNetwork with several inputs and outputs (psrv.nn.torch_io): the network contract (compute_update
equals a plain torch step and never writes params), the losses per output, evaluation per output,
inference, MultiDataSet training locally, and the file round trip."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn import MultiDataSet, TorchNetwork  # noqa: E402
from psrv.nn.errors import ConfigError, InvalidInputError  # noqa: E402
from psrv.nn.evaluation import Evaluation, RegressionEvaluation, ROCMultiClass  # noqa: E402
from psrv.nn.torch_io import PerOutput, input_shapes  # noqa: E402


class TwoInTwoOut(torch.nn.Module):
    """Two inputs (6 values, a 2x3 grid), two outputs: 4 class logits and 2 regression values."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(6, 8)
        self.classes = torch.nn.Linear(16, 4)
        self.values = torch.nn.Linear(16, 2)

    def forward(self, x1, x2):
        h = torch.relu(torch.cat([self.a(x1), self.b(x2.flatten(1))], dim=1))
        return self.classes(h), self.values(h)


def _network(seed: int = 3, **kwargs) -> TorchNetwork:
    torch.manual_seed(seed)
    kwargs.setdefault("optimizer", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3))
    kwargs.setdefault("output_activation", ["softmax", None])
    return TorchNetwork(TwoInTwoOut(), [torch.nn.CrossEntropyLoss(), torch.nn.MSELoss()],
                        input_shape=[(6,), (2, 3)], seed=seed, **kwargs)


def _data(seed: int, n: int = 32) -> MultiDataSet:
    """Learnable: the class is which of the first 4 inputs is largest, the values are sums of x2's rows."""
    rng = np.random.default_rng(seed)
    x1 = rng.random((n, 6), dtype=np.float32)
    x2 = rng.random((n, 2, 3), dtype=np.float32)
    classes = np.eye(4, dtype=np.float32)[x1[:, :4].argmax(axis=1)]
    values = x2.sum(axis=2).astype(np.float32)
    return MultiDataSet([x1, x2], [classes, values])


def test_input_shapes_read_one_shape_or_one_per_input() -> None:
    assert input_shapes(64) == (((64,),), False)
    assert input_shapes((1, 28, 28)) == (((1, 28, 28),), False)
    assert input_shapes([3, 4]) == (((3, 4),), False)  # a list of ints stays ONE shape
    assert input_shapes([(6,), (2, 3)]) == (((6,), (2, 3)), True)
    assert input_shapes([(6,), 5]) == (((6,), (5,)), True)
    with pytest.raises(ConfigError, match=r"input_shape\[1\]"):
        input_shapes([(6,), (0, 3)])


def test_layout_of_a_two_input_two_output_module() -> None:
    net = _network()
    assert net.multi_input and net.multi_output
    assert net.input_shape == ((6,), (2, 3)) and net.output_sizes == (4, 2) and net.num_outputs == 4
    outs = net.output(_data(0).features)
    assert isinstance(outs, list) and [o.shape for o in outs] == [(32, 4), (32, 2)]
    np.testing.assert_allclose(outs[0].sum(axis=1), 1.0, rtol=1e-5)  # softmax on the first output only
    preds = net.predict(_data(0).features)
    assert preds[0].shape == (32,) and preds[0].max() < 4
    with pytest.raises(ConfigError, match="the module has 2 outputs, got a sequence of 3"):
        _network(output_activation=["softmax", None, None])


def test_compute_update_equals_a_plain_torch_step_and_never_writes_params() -> None:
    net = _network()
    torch.manual_seed(3)
    plain = TwoInTwoOut()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    np.testing.assert_array_equal(net.params, torch.cat([p.detach().reshape(-1) for p in plain.parameters()]))
    for step in range(3):
        data = _data(step)
        before = net.params.copy()
        update, loss = net.compute_update(data.features, data.labels, data.labels_mask)
        np.testing.assert_array_equal(net.params, before)  # the contract: compute_update never writes params
        assert np.any(update != 0)
        net.apply_update(update)
        opt.zero_grad()
        c, v = plain(torch.from_numpy(data.features[0]), torch.from_numpy(data.features[1]))
        expected = (torch.nn.functional.cross_entropy(c, torch.from_numpy(data.labels[0]))
                    + torch.nn.functional.mse_loss(v, torch.from_numpy(data.labels[1])))
        expected.backward()
        opt.step()
        assert loss == pytest.approx(float(expected.detach()), rel=1e-5)  # the sum of the outputs' losses
        flat = torch.cat([p.detach().reshape(-1) for p in plain.parameters()]).numpy()
        np.testing.assert_allclose(net.params, flat, rtol=1e-5, atol=1e-6)


def test_labels_masks_weigh_each_output() -> None:
    net = _network()
    data = _data(1)
    zero_second = [None, np.zeros(32, np.float32)]
    _, masked = net.compute_gradient(data.features, data.labels, zero_second)
    first_only = _network()  # same seed: same parameters
    torch.manual_seed(0)
    c, _ = first_only.module(*(torch.from_numpy(x) for x in data.features))
    expected = torch.nn.functional.cross_entropy(c, torch.from_numpy(data.labels[0]))
    assert masked == pytest.approx(float(expected.detach()), rel=1e-5)


def test_bad_batches_name_the_input_or_output() -> None:
    net = _network()
    data = _data(0)
    with pytest.raises(InvalidInputError, match="the module has 2 inputs, got 1 arrays"):
        net.compute_update([data.features[0]], data.labels)
    with pytest.raises(InvalidInputError, match=r"features\[1\] \(input_shape\[1\]=\(2, 3\)\)"):
        net.compute_update([data.features[0], np.zeros((32, 5), np.float32)], data.labels)
    with pytest.raises(InvalidInputError, match=r"labels\[1\] \(output 1 has 2 columns\)"):
        net.compute_update(data.features, [data.labels[0], np.zeros((32, 3), np.float32)])
    before = net.params.copy()
    assert net.iteration == 0 and np.array_equal(net.params, before)


def test_fit_on_a_multidataset_learns_and_evaluates_per_output() -> None:
    net = _network(optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2))
    train, test = _data(10, 512), _data(11, 256)
    before = net.score(test)
    net.fit(train, epochs=15, batch_size=32)
    assert net.score(test) < 0.5 * before
    result = net.evaluate(test)
    assert isinstance(result, PerOutput) and len(result) == 2
    assert isinstance(result[0], Evaluation) and isinstance(result[1], RegressionEvaluation)
    assert result[0].accuracy() >= 0.7, result[0].accuracy()
    assert result[1].r_squared() > 0.5
    first = net.evaluate(test, Evaluation(num_classes=4))  # one evaluation object: the first output only
    assert first.accuracy() == pytest.approx(result[0].accuracy())
    chosen = net.evaluate(test, PerOutput([ROCMultiClass(), RegressionEvaluation()]))  # one per output
    assert chosen[0].average_auc() > 0.8 and chosen[1].r_squared() == pytest.approx(
        result[1].r_squared())
    # evaluated in batches or at once: the same counts
    batched = net.evaluate(test, batch_size=50)
    np.testing.assert_array_equal(batched[0].confusion_matrix(), result[0].confusion_matrix())


def test_save_load_round_trip_keeps_the_layout_the_parameters_and_the_optimizer(tmp_path) -> None:
    net = _network(optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2))
    net.fit(_data(4, 128), epochs=2, batch_size=32)
    net.save(tmp_path / "two.pt")
    loaded = TorchNetwork.load(tmp_path / "two.pt")
    assert loaded.input_shape == net.input_shape and loaded.output_sizes == net.output_sizes
    assert loaded.layout.activations == (("softmax", None)) and loaded.iteration == net.iteration
    np.testing.assert_array_equal(loaded.params, net.params)
    np.testing.assert_array_equal(loaded.updater_state, net.updater_state)
    data = _data(5)
    for mine, theirs in zip(net.output(data.features), loaded.output(data.features), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # the next step is the same on both
    a, _ = net.compute_update(data.features, data.labels)
    b, _ = loaded.compute_update(data.features, data.labels)
    np.testing.assert_array_equal(a, b)
    assert net.get_config()["input_shape"] == [[6], [2, 3]]


def test_one_input_several_outputs_and_several_inputs_one_output() -> None:
    class Split(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(5, 6)

        def forward(self, x):
            h = self.body(x)
            return [h[:, :3], h[:, 3:]]

    class Join(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(7, 3)

        def forward(self, x1, x2):
            return self.body(torch.cat([x1, x2], dim=1))

    split = TorchNetwork(Split(), torch.nn.CrossEntropyLoss(), input_shape=(5,))
    assert not split.multi_input and split.multi_output and split.output_sizes == (3, 3)
    x = np.ones((4, 5), np.float32)
    update, _ = split.compute_update(x, [np.array([0, 1, 2, 0]), np.array([2, 2, 1, 0])])
    assert update.shape == (split.num_params,)
    join = TorchNetwork(Join(), torch.nn.CrossEntropyLoss(), input_shape=[(3,), (4,)])
    assert join.multi_input and not join.multi_output
    out = join.output([np.ones((4, 3), np.float32), np.ones((4, 4), np.float32)])
    assert isinstance(out, np.ndarray) and out.shape == (4, 3)
    with pytest.raises(InvalidInputError, match="the module takes one input"):
        split.output([x, x])


def test_a_single_input_single_output_network_takes_a_one_in_one_out_multidataset() -> None:
    torch.manual_seed(2)
    module = torch.nn.Sequential(torch.nn.Linear(6, 4))
    net = TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(6,), seed=2)
    other = TorchNetwork.from_bytes(net.to_bytes())
    data = _data(7)
    multi = MultiDataSet([data.features[0]], [data.labels[0]])
    a, _ = net.compute_update(multi.features, multi.labels, [None])
    b, _ = other.compute_update(data.features[0], data.labels[0])
    np.testing.assert_array_equal(a, b)
    net.fit(multi, epochs=1, batch_size=8)
    rows = data.features[0][:3].tolist()  # example rows as plain lists stay a batch of 3
    assert net.output(rows).shape == (3, 4)
    assert net.output([data.features[0][0]]).shape == (1, 4)  # a list of one example row


def test_the_sequential_network_takes_a_one_in_one_out_multidataset_and_names_itself_for_more() -> None:
    from psrv.nn import Dense, Network, Output

    net = Network([Dense(8), Output(4)], input_shape=(6,), seed=1)
    data = _data(8)
    net.fit(MultiDataSet([data.features[0]], [data.labels[0]]), epochs=1, batch_size=8)
    assert net.iteration == 4
    with pytest.raises(InvalidInputError, match=r"psrv.nn.Network is sequential"):
        net.fit(MultiDataSet([data.features[0], data.features[0]], [data.labels[0]]))
