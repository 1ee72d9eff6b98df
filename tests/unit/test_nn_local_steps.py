"""Several optimizer steps a message: ``TorchNetwork``'s ``local_steps`` (what ``SharedTrainingMaster(
local_steps=K)`` asks of every step path of a task) against the plain optimizer over the minibatch's
pieces, and the setting's checks on the driver."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn import NonFiniteLossError  # noqa: E402
from psrv.nn.torch_adapter import TorchNetwork  # noqa: E402
from psrv.spark import SharedTrainingMaster  # noqa: E402
from psrv.spark.driver.stepping import (  # noqa: E402
    AUTO_MAX_PARAMETERS,
    AUTO_MAX_SGD_WORKERS,
    AUTO_MIN_ROWS,
    choose_local_steps,
)
from psrv.spark.errors import SparkConfigError  # noqa: E402


def _adam(params):
    return torch.optim.Adam(params, lr=1e-2)


def _net(dtype=torch.float64) -> TorchNetwork:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3)).to(dtype)
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), (6,), optimizer=_adam)


def _batch(rows: int, seed: int, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, 6)).astype(dtype), np.eye(3, dtype=dtype)[rng.integers(0, 3, rows)]


def _adam_steps(net: TorchNetwork) -> list[int]:
    return [int(state["step"]) for state in net.optimizer.state.values()]


@pytest.mark.parametrize("pieces", [2, 3, 4])
def test_local_steps_are_the_plain_optimizer_over_the_minibatchs_pieces(pieces: int) -> None:
    """K local steps on a minibatch of 10 rows (uneven pieces, as np.array_split cuts them) are K plain
    steps on the pieces in turn, each applied before the next: the same parameters to float64 rounding
    (the K steps are added at once), K optimizer steps a call, the pieces' row-weighted mean loss, and the
    live parameters untouched by the call itself."""
    sharing, plain = _net(), _net()
    for call in range(4):
        x, y = _batch(10, seed=call)
        live = sharing.params.copy()
        update, loss = sharing.compute_update(x, y, local_steps=pieces)
        np.testing.assert_array_equal(sharing.params, live)  # compute_update never writes params
        sharing.apply_update(update)
        losses = []
        for xp, yp in zip(np.array_split(x, pieces), np.array_split(y, pieces), strict=True):
            step, piece_loss = plain.compute_update(xp, yp)
            plain.apply_update(step)
            losses.append(piece_loss * len(xp))
        assert loss == pytest.approx(sum(losses) / len(x), rel=1e-12)
        np.testing.assert_allclose(sharing.params, plain.params, rtol=0, atol=1e-12)
    assert _adam_steps(sharing) == _adam_steps(plain) == [4 * pieces] * 4
    assert sharing.iteration == 4  # one a minibatch (a message); the optimizer counts its own steps


def test_the_task_paths_from_the_replica_plus_the_residual_are_local_steps_taken_there() -> None:
    """The Spark task's host path (compute_update_pair, loaded with live + residual) and device path
    (compute_update_tensor with the residual a tensor, on CPU tensors) take their K steps where a twin whose
    live parameters ARE live + residual takes them: bit for bit, live parameters never written."""
    from psrv.nn.torch_flat import load_with
    from psrv.spark.task.sharing import _load_with_residual

    for path in ("pair", "tensor"):
        net, twin = _net(torch.float32), _net(torch.float32)
        residual = np.random.default_rng(5).normal(0, 1e-2, net.num_params).astype(np.float32)
        for call in range(3):
            x, y = _batch(13, seed=call, dtype=np.float32)
            live = net.params.copy()
            twin.params[:] = live + residual  # the same float32 sum as the kernel's
            if path == "pair":
                after, before, loss = net.compute_update_pair(
                    x, y, from_loaded=True, local_steps=3,
                    load=partial(_load_with_residual, residual=residual))
                update = after - before
            else:
                tensor, loss = net.compute_update_tensor(x, y, from_loaded=True, local_steps=3,
                                                         load=load_with(torch.from_numpy(residual)))
                update = tensor.numpy().copy()
            twin_update, twin_loss = twin.compute_update(x, y, local_steps=3)
            assert loss == twin_loss
            np.testing.assert_array_equal(update.view(np.uint32), twin_update.view(np.uint32))
            np.testing.assert_array_equal(net.params.view(np.uint32), live.view(np.uint32))
            net.params[:] += 0.5 * update  # the replica moves by something, as messages move it
        assert _adam_steps(net) == [9] * 4


def test_a_minibatch_smaller_than_the_local_steps_takes_pieces_of_two_rows_at_least() -> None:
    for rows, steps in ((5, 2), (4, 2), (3, 1), (2, 1), (1, 1)):
        net = _net()
        x, y = _batch(rows, seed=0)
        net.compute_update(x, y, local_steps=5)
        assert _adam_steps(net) == [steps] * 4, rows
    x, y = _batch(3, seed=0)  # one piece: the one step of the whole minibatch
    np.testing.assert_array_equal(_net().compute_update(x, y, local_steps=2)[0],
                                  _net().compute_update(x, y)[0])


def test_batch_norm_trains_on_a_short_last_minibatch_with_local_steps() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 3))
    net = TorchNetwork(module, torch.nn.CrossEntropyLoss(), (6,))
    x, y = _batch(3, seed=1, dtype=np.float32)  # a piece of 1 row fails: BatchNorm needs more than one
    update, loss = net.compute_update(x, y, local_steps=2)
    assert np.isfinite(update).all() and np.abs(update).max() > 0 and np.isfinite(loss)


class _MaskedMean(torch.nn.Module):
    """A sequence model that reads the features mask: the masked mean of its steps, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.step = torch.nn.Linear(4, 5)
        self.head = torch.nn.Linear(5, 3)

    def forward(self, x, mask=None):
        h = torch.tanh(self.step(x))
        weights = torch.ones(x.shape[:2], dtype=x.dtype) if mask is None else mask
        pooled = (h * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp(min=1)
        return self.head(pooled)


def test_local_steps_split_the_features_mask_with_the_rows() -> None:
    """Each piece's forward pass gets its own rows of the features mask (a mask of the whole minibatch on a
    piece would not fit): the same as the plain optimizer over the pieces with their masks."""
    def network() -> TorchNetwork:
        torch.manual_seed(1)
        return TorchNetwork(_MaskedMean().double(), torch.nn.CrossEntropyLoss(), (7, 4), optimizer=_adam)

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(9, 7, 4)), np.eye(3)[rng.integers(0, 3, 9)]
    mask = (rng.random((9, 7)) < 0.7).astype(np.float64)
    mask[:, 0] = 1
    sharing, plain = network(), network()
    update, _ = sharing.compute_update(x, y, features_mask=mask, local_steps=2)
    total = np.zeros_like(update)
    for rows in np.array_split(np.arange(9), 2):
        step, _ = plain.compute_update(x[rows], y[rows], features_mask=mask[rows])
        plain.apply_update(step)
        total += step
    np.testing.assert_allclose(update, total, rtol=0, atol=1e-12)


class _Overflowing(torch.nn.Module):
    """A linear layer whose output is infinite for rows marked with a large first feature."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x):
        out = self.linear(x)
        return torch.where(x[:, :1] > 100, torch.full_like(out, float("inf")), out)


def test_a_diverged_piece_is_the_usual_error_and_leaves_the_module_on_its_live_parameters() -> None:
    torch.manual_seed(0)
    net = TorchNetwork(_Overflowing().double(), torch.nn.CrossEntropyLoss(), (6,), optimizer=_adam)
    pointers = [p.data_ptr() for p in net.module.parameters()]
    live = net.params.copy()
    x, y = _batch(8, seed=0)
    x[6, 0] = 1000.0  # in the last piece: after the first piece's step moved the step buffer
    with pytest.raises(NonFiniteLossError, match="loss is nan|loss is inf"):
        net.compute_update(x, y, local_steps=2)
    assert [p.data_ptr() for p in net.module.parameters()] == pointers
    np.testing.assert_array_equal(net.params, live)
    x[6, 0] = 0.0  # and the next minibatch steps from the live parameters as usual
    update, _ = net.compute_update(x, y, local_steps=2)
    assert np.isfinite(update).all() and np.abs(update).max() > 0


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", "Auto", True, None])
def test_the_master_refuses_local_steps_that_are_not_auto_or_a_whole_number_of_at_least_one(bad) -> None:
    assert SharedTrainingMaster().local_steps == "auto"  # the default: the driver decides (below)
    assert SharedTrainingMaster(local_steps=np.int64(3)).local_steps == 3
    assert SharedTrainingMaster(local_steps=1).local_steps == 1
    expected = r"local_steps: expected \"auto\" or a whole number >= 1 of optimizer steps a message, got "
    with pytest.raises(SparkConfigError, match=expected + r".*; \"auto\" \(the default\)"):
        SharedTrainingMaster(local_steps=bad)


def _torch_net(module, optimizer=None) -> TorchNetwork:
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), (module.in_features,), optimizer=optimizer)


@pytest.mark.parametrize(("optimizer", "kind"), [
    (None, "Adam"),  # TorchNetwork's own default
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3), "AdamW"),
    (lambda ps: torch.optim.NAdam(ps, lr=1e-3), "NAdam"),
    (lambda ps: torch.optim.RMSprop(ps, lr=1e-4, momentum=0.9), "RMSprop"),
    (lambda ps: torch.optim.RMSprop(ps, lr=1e-4), "RMSprop"),
    (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), "SGD"),
])
def test_auto_takes_two_steps_for_a_small_model_with_a_measured_optimizer(optimizer, kind) -> None:
    steps, why = choose_local_steps("auto", _torch_net(torch.nn.Linear(6, 3), optimizer), 32)
    assert steps == 2
    assert why == (f"auto: 2 optimizer steps a message (21 parameters, {kind}, minibatches of 32 rows in "
                   "pieces of 16 and 16)")
    assert choose_local_steps("auto", _torch_net(torch.nn.Linear(6, 3), optimizer), 17)[1].endswith(
        "pieces of 9 and 8)")


def test_auto_takes_one_step_where_a_second_was_not_measured_to_help_or_costs_too_much() -> None:
    sgd = _torch_net(torch.nn.Linear(6, 3), lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9))
    assert choose_local_steps("auto", sgd, 32)[0] == 2  # one worker, as many side by side as measured
    assert choose_local_steps("auto", sgd, 32, workers=AUTO_MAX_SGD_WORKERS)[0] == 2
    assert choose_local_steps("auto", sgd, 32, workers=AUTO_MAX_SGD_WORKERS + 1) == (
        1, "auto: 1 (SGD with 5 workers side by side: with SGD two local steps helped up to 4 and lost at 8)")
    assert choose_local_steps("auto", _torch_net(torch.nn.Linear(6, 3)), 32, workers=64)[0] == 2  # Adam
    adagrad = _torch_net(torch.nn.Linear(6, 3), lambda ps: torch.optim.Adagrad(ps, lr=0.01))
    assert choose_local_steps("auto", adagrad, 32) == (
        1, "auto: 1 (Adagrad is neither Adam's kind, RMSprop nor SGD, the optimizers that two local steps "
           "were measured to help)")
    at_most = _torch_net(torch.nn.Linear(999, 500))  # 500,000 parameters: the largest "auto" steps twice
    over = _torch_net(torch.nn.Linear(1000, 500))  # 500,500
    assert (at_most.num_params, over.num_params) == (AUTO_MAX_PARAMETERS, AUTO_MAX_PARAMETERS + 500)
    assert choose_local_steps("auto", at_most, 32)[0] == 2
    assert choose_local_steps("auto", over, 32) == (1, "auto: 1 (500,500 parameters, over 500,000: there a "
                                                       "second step a message costs more compute than it is "
                                                       "worth)")
    small = _torch_net(torch.nn.Linear(6, 3))
    assert choose_local_steps("auto", small, AUTO_MIN_ROWS)[0] == 2
    assert choose_local_steps("auto", small, AUTO_MIN_ROWS - 1) == (
        1, "auto: 1 (minibatches of 15 rows; two steps need 16 or more)")
    from psrv.nn import Network
    from psrv.nn.layers import Dense, Output

    native = Network([Dense(4), Output(3)], input_shape=(6,), seed=1)
    assert choose_local_steps("auto", native, 32) == (1, "auto: 1 (Network's step takes no local_steps)")
    for setting in (1, 3):  # a number is taken as set, for any network
        assert choose_local_steps(setting, sgd, 32) == (setting, f"local_steps={setting}, as set")
        assert choose_local_steps(setting, native, 8)[0] == setting


def test_the_estimator_takes_local_steps_as_a_param_for_its_default_master_only() -> None:
    from psrv.spark.ml import TorchEstimator

    def estimator(**params):
        return TorchEstimator(torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss(), input_shape=(4,),
                              feature_cols=["f"], **params)

    assert estimator()._master().local_steps == "auto"
    assert estimator().getLocalSteps() == "auto"
    assert estimator(local_steps=1)._master().local_steps == 1
    assert estimator(local_steps=2)._master().local_steps == 2
    assert estimator(localSteps=4).getLocalSteps() == 4  # Spark's own name
    assert "localSteps: optimizer steps a message" in estimator().explainParams()
    for bad in (0, "two", True):
        with pytest.raises(SparkConfigError, match="localSteps: expected 'auto' or a positive int"):
            estimator(local_steps=bad)
    with pytest.raises(SparkConfigError, match="set local_steps on it instead"):
        estimator(local_steps=2, training_master=SharedTrainingMaster())._master()
