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


def test_a_minibatch_smaller_than_the_local_steps_takes_one_step_a_row() -> None:
    net = _net()
    x, y = _batch(2, seed=0)
    net.compute_update(x, y, local_steps=5)
    assert _adam_steps(net) == [2] * 4
    one = _net()
    np.testing.assert_array_equal(one.compute_update(x, y, local_steps=1)[0], _net().compute_update(x, y)[0])


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


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True, None])
def test_the_master_refuses_local_steps_that_are_not_a_whole_number_of_at_least_one(bad) -> None:
    assert SharedTrainingMaster().local_steps == 1  # the default: one optimizer step a message
    assert SharedTrainingMaster(local_steps=np.int64(3)).local_steps == 3
    with pytest.raises(SparkConfigError, match=r"local_steps: expected a whole number >= 1 of optimizer "
                                               r"steps a message, got .*; 1 \(the default\)"):
        SharedTrainingMaster(local_steps=bad)


def test_the_estimator_takes_local_steps_as_a_param_for_its_default_master_only() -> None:
    from psrv.spark.ml import TorchEstimator

    def estimator(**params):
        return TorchEstimator(torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss(), input_shape=(4,),
                              feature_cols=["f"], **params)

    assert estimator()._master().local_steps == 1
    assert estimator(local_steps=2)._master().local_steps == 2
    assert estimator(localSteps=4).getLocalSteps() == 4  # Spark's own name
    assert "localSteps: optimizer steps a message" in estimator().explainParams()
    with pytest.raises(SparkConfigError, match="localSteps: expected a positive int"):
        estimator(local_steps=0)
    with pytest.raises(SparkConfigError, match="set local_steps on it instead"):
        estimator(local_steps=2, training_master=SharedTrainingMaster())._master()
