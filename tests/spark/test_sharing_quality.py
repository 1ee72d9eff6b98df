"""Gradient sharing learns as much per epoch as one process: TorchEstimator fits on local-cluster (2
workers) against the same module trained in this process for the same epochs, with the defaults (tau
from each step's residual at 3 % of the elements, under 1/100 of the bytes of a dense exchange; each
worker stepping from its replica plus its residual; Adam's beta1 ** workers), with DL4J's threshold
in their place, with SGD (its momentum ** workers, its lr scaled to keep the step's size), with RMSprop
(the same, and its square average started at the first gradient's square), and with one
optimizer step a message where the default ``local_steps="auto"`` takes two for this small model."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sklearn_datasets = pytest.importorskip("sklearn.datasets")

from psrv.encoding import ResidualClipping, dl4j_threshold, shared_training_threshold  # noqa: E402
from psrv.nn import TorchNetwork  # noqa: E402
from psrv.nn.momentum import SQUARE_START_NAME  # noqa: E402
from psrv.spark import SharedTrainingMaster  # noqa: E402
from psrv.spark.ml import TorchEstimator  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

EPOCHS = 5


def _optimizer(name: str):
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "rmsprop":
        return lambda params: torch.optim.RMSprop(params, lr=1e-4, momentum=0.9)
    return lambda params: torch.optim.Adam(params, lr=1e-3)


@pytest.mark.parametrize(("threshold", "optimizer", "local_steps", "taken"),
                         [("default", "adam", "auto", 2), ("dl4j", "adam", 1, 1),
                          ("default", "sgd", "auto", 2), ("default", "rmsprop", "auto", 2),
                          ("default", "adam", 1, 1)])
def test_sharing_reaches_single_process_accuracy_at_equal_epochs(spark, threshold: str, optimizer: str,
                                                                 local_steps: int | str, taken: int) -> None:
    x, y = sklearn_datasets.make_classification(n_samples=3000, n_features=16, n_informative=8, n_redundant=4,
                                                n_classes=3, class_sep=2.0, random_state=7)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    x_train, y_train, x_test, y_test = x[:2400], y[:2400], x[2400:], y[2400:]
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                 torch.nn.ReLU(), torch.nn.Linear(128, 3))
    reference = TorchNetwork(copy.deepcopy(module), torch.nn.CrossEntropyLoss(), (16,), seed=0,
                             optimizer=_optimizer(optimizer))
    reference.fit((x_train, y_train), epochs=EPOCHS, batch_size=32)
    alone = float(np.mean(reference.predict(x_test) == y_test))

    master = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2, threshold_algorithm=(
        dl4j_threshold() if threshold == "dl4j" else None), local_steps=local_steps)
    assert isinstance(master.residual_post_processor, ResidualClipping) and master.step_from == "own"
    if threshold == "default":
        assert master.threshold_algorithm == shared_training_threshold()
    rows = [(row.tolist(), int(label)) for row, label in zip(x_train, y_train, strict=True)]
    frame = spark.createDataFrame(rows, ["features", "label"])
    model = TorchEstimator(module, torch.nn.CrossEntropyLoss(), input_shape=(16,), epochs=EPOCHS, seed=0,
                           optimizer=_optimizer(optimizer), training_master=master).fit(frame)
    shared = float(np.mean(model.network.predict(x_test) == y_test))
    assert shared >= alone - 0.02, (shared, alone)
    fit = master.last_fit
    assert fit["workers"] == 2 and fit["replicas_diverged"] == 0
    assert fit["step_from"] == {"own": 2}  # the default: each worker's step from its replica + residual
    assert fit["local_steps"] == {taken: 2}  # "auto": 2 for this model of 19,075 parameters
    kind = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop"}[optimizer]
    assert fit["local_steps_rule"].startswith(f"auto: 2 optimizer steps a message (19,075 parameters, {kind}"
                                              if taken == 2 else "local_steps=1, as set")
    assert fit["updates_missing"] == 0 and fit["replicas_checked"] == 2
    # one message a minibatch, whatever the steps a message: the last epoch's rows in minibatches of 32
    # (at most one short one a partition); DL4J's adaptive τ may find nothing to send in a step
    assert fit["examples"] == len(x_train)
    assert fit["messages"] == fit["steps"] if threshold == "default" else 0 < fit["messages"] <= fit["steps"]
    assert len(x_train) / 32 <= fit["steps"] <= len(x_train) / 32 + 2
    # the default: each worker's momentum forgets per minibatch of both workers as one process's does
    assert fit["momentum_workers"] == 2
    group = model.network.optimizer.param_groups[0]  # the driver's: as given
    if optimizer == "adam":
        assert [(name, given) for name, given, _ in fit["momentum"]] == [("Adam betas[0]", 0.9)]
        assert fit["momentum"][0][2] == pytest.approx(0.81, abs=1e-12)
        assert group["betas"] == (0.9, 0.999)
    else:  # the lr scaled with it, by (1 - 0.81) / (1 - 0.9): the step a gradient makes keeps its size
        lr = 0.01 if optimizer == "sgd" else 1e-4
        started = [(f"RMSprop {SQUARE_START_NAME}", 0.0)] if optimizer == "rmsprop" else []
        assert [(name, given) for name, given, _ in fit["momentum"]] == [(f"{kind} momentum", 0.9),
                                                                         (f"{kind} lr", lr), *started]
        nows = [0.81, 1.9 * lr] + [1.0] * len(started)
        assert [now for _, _, now in fit["momentum"]] == pytest.approx(nows, abs=1e-12)
        assert group["momentum"] == 0.9 and group["lr"] == lr
        assert not model.network.optimizer._optimizer_step_pre_hooks  # the driver's: no start set
    if threshold == "default":
        assert fit["bytes_sent"] <= fit["dense_bytes"] / 100  # the last epoch's messages: <= 1/100 of dense


def test_a_small_models_messages_stay_within_the_byte_budget_and_learn_as_one_process(spark) -> None:
    """A model of 963 parameters, where 3 % of the elements would take over 1/100 of a dense update
    in a packed message (its 16-byte header is 0.4 % of the 3,852 dense bytes): the default's byte
    budget reaches the workers, every message of the fit stays within it, and the model still learns
    what one process learns in the same epochs."""
    x, y = sklearn_datasets.make_classification(n_samples=2400, n_features=16, n_informative=8, n_redundant=4,
                                                n_classes=3, class_sep=2.0, random_state=3)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    x_train, y_train, x_test, y_test = x[:1920], y[:1920], x[1920:], y[1920:]
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.ReLU(), torch.nn.Linear(48, 3))
    assert sum(p.numel() for p in module.parameters()) == 963
    reference = TorchNetwork(copy.deepcopy(module), torch.nn.CrossEntropyLoss(), (16,), seed=0,
                             optimizer=_optimizer("adam"))
    reference.fit((x_train, y_train), epochs=3, batch_size=32)
    alone = float(np.mean(reference.predict(x_test) == y_test))
    master = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2)
    assert master.threshold_algorithm.budget_elements(963) == 18  # 3 % would be 29
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x_train, y_train,
                                                                                    strict=True)],
                                  ["features", "label"])
    model = TorchEstimator(module, torch.nn.CrossEntropyLoss(), input_shape=(16,), epochs=3, seed=0,
                           optimizer=_optimizer("adam"), training_master=master).fit(frame)
    shared = float(np.mean(model.network.predict(x_test) == y_test))
    fit = master.last_fit
    assert fit["replicas_diverged"] == 0 and fit["updates_missing"] == 0
    assert fit["messages"] == fit["steps"] > 0
    assert fit["threshold_rule"].endswith("fewer to stay within 0.01 of a dense update's 3,852 bytes: "
                                          "about 18 of 963 elements a message, where 0.03 would be 29")
    assert fit["bytes_sent"] <= fit["dense_bytes"] / 100, (fit["bytes_sent"], fit["dense_bytes"])
    assert fit["bytes_sent"] / fit["messages"] <= 4 * (4 + 5)  # a header and at most 5 words of 18 elements
    # on the wire every update travels in a compact frame, no larger than its payload (whose 16-byte
    # header it drops for 12-20 bytes of fields), beside each node's join, master-copy request and
    # leave (about 220 bytes) and its heartbeats; protocol 2's msgpack rows took 50 bytes an update more
    data = fit["wire_bytes"] - fit["heartbeat_bytes"]
    assert fit["heartbeat_bytes"] >= 0
    assert fit["bytes_sent"] - 4 * fit["messages"] <= data <= fit["bytes_sent"] + 300 * fit["workers"], fit
    assert shared >= alone - 0.02, (shared, alone)
