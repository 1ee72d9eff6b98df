"""The PyTorch user's path on Spark, without Spark: shipping by value, worker-side re-fit, driver checks,
and a worker's error as the user's first line."""

from __future__ import annotations

import importlib
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn import Dense, Network, Output, TorchNetwork  # noqa: E402
from psrv.nn.data import DataSet  # noqa: E402
from psrv.spark.driver import preflight, shipping  # noqa: E402
from psrv.spark.driver.job_errors import find_worker_error, worker_errors  # noqa: E402
from psrv.spark.errors import SparkConfigError, SparkInputError, TrainingJobError  # noqa: E402
from psrv.spark.payload import NetworkPayload  # noqa: E402
from psrv.spark.task.worker import training_network  # noqa: E402


def _torch_net(seed: int) -> TorchNetwork:
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), (8,),
                        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2), seed=seed)


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(16, 8)).astype(np.float32), np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]


# -- failure 2: re-fit in one Python worker ------------------------------------------------------------

def test_second_network_of_same_architecture_gets_its_own_worker_copy() -> None:
    """Was: the worker cache keyed by the configuration handed the first network's copy (with Adam's
    state) to the second, fresh network: "updater state: expected a flat vector of shape (N,), got (0,)"."""
    first, second = _torch_net(1), _torch_net(2)
    x, y = _batch()
    worker = training_network(NetworkPayload.from_network(first, with_updater=True))
    worker.compute_update(x, y)  # the worker's copy now has optimizer state
    fresh = training_network(NetworkPayload.from_network(second, with_updater=True))
    assert fresh is not worker
    np.testing.assert_array_equal(fresh.params, second.params)
    assert fresh.updater_state.size == 0  # nothing of the first network's Adam state
    fresh.compute_update(x, y)


def test_same_network_reuses_its_worker_copy_with_its_own_vectors() -> None:
    net = _torch_net(3)
    x, y = _batch()
    net.compute_update(x, y)  # the driver's network has optimizer state
    worker = training_network(NetworkPayload.from_network(net, with_updater=True))
    net.apply_update(np.full(net.num_params, 0.01, dtype=np.float32))
    again = training_network(NetworkPayload.from_network(net, with_updater=True))
    assert again is worker
    np.testing.assert_array_equal(again.params, net.params)
    np.testing.assert_array_equal(again.updater_state, net.updater_state)


# -- failure 1: __main__ / notebook code travels by value --------------------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module in the driver's own folder (as a user's models.py next to the script)."""
    name = f"psrv_user_models_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(
        "import torch\n"
        "class UserNet(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(8, 3)\n"
        "    def forward(self, x):\n"
        "        return self.layer(x) * 2.0\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


def test_module_of_main_or_registered_travels_by_value(user_module, tmp_path) -> None:
    from pyspark import cloudpickle

    net = TorchNetwork(user_module.UserNet(), torch.nn.CrossEntropyLoss(), (8,), seed=0)
    cloudpickle.register_pickle_by_value(user_module)  # what code of __main__ / a notebook gets
    try:
        payload = NetworkPayload.from_network(net, with_updater=True)
    finally:
        cloudpickle.unregister_pickle_by_value(user_module)
    sys.modules.pop(user_module.__name__)
    (tmp_path / f"{user_module.__name__}.py").unlink()  # the executors do not have the module
    copy = payload.build()
    x, _ = _batch()
    np.testing.assert_allclose(copy.output(x), net.output(x), rtol=1e-6)


def test_module_only_in_the_script_folder_is_refused_on_the_driver(user_module) -> None:
    net = TorchNetwork(user_module.UserNet(), torch.nn.CrossEntropyLoss(), (8,), seed=0)
    with pytest.raises(SparkConfigError) as info:
        shipping.check_network(net, None)
    text = str(info.value)
    assert "UserNet" in text and user_module.__name__ in text
    assert "addPyFile" in text and "--py-files" in text


def test_module_on_pythonpath_is_shipped_by_reference(user_module, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    net = TorchNetwork(user_module.UserNet(), torch.nn.CrossEntropyLoss(), (8,), seed=0)
    shipping.check_network(net, None)  # no error: the executors' interpreter finds it
    installed = TorchNetwork(torch.nn.Linear(8, 3), torch.nn.MSELoss(), (8,), output_activation=None)
    shipping.check_network(installed, None)


class _LockedLoader:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def load(self, path: str) -> DataSet:  # pragma: no cover - never reached
        raise AssertionError(path)


def test_loader_checks_name_the_loader_and_the_fix() -> None:
    with pytest.raises(SparkConfigError, match=r"^loader: .*cannot be pickled.*lock.*load\(path\)"):
        shipping.check_loader(_LockedLoader(), None)
    with pytest.raises(SparkConfigError, match=r"^loader: expected an object with a load\(path\)"):
        shipping.check_loader(object(), None)


# -- failure 3: driver checks -------------------------------------------------------------------------

def test_batch_larger_than_every_worker_is_refused() -> None:
    data = preflight.DataProfile([[256, 256, 256, 132], [256, 256, 256, 120]], None)  # 1788 examples
    preflight.check_batch_fits(512, data, 2, repartitioned=True)
    with pytest.raises(SparkConfigError, match=r"batch_size_per_worker=5000 .* at most 1024 each.*<= 1024"):
        preflight.check_batch_fits(5000, data, 2, repartitioned=True)
    assert data.shares(2, repartitioned=False) == [900, 888]
    with pytest.raises(SparkInputError, match="no example"):
        preflight.check_batch_fits(1, preflight.DataProfile([[], []], None), 2, repartitioned=True)


def test_sample_that_does_not_fit_names_input_shape() -> None:
    x, y = _batch()
    preflight.check_sample(_torch_net(0), DataSet(x[:2], y[:2]))
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(72, 3))
    images = TorchNetwork(conv, torch.nn.CrossEntropyLoss(), (1, 8, 8), seed=0)
    with pytest.raises(SparkInputError, match=r"input_shape is \(1, 8, 8\)"):
        preflight.check_sample(images, DataSet(x[:2], y[:2]))
    with pytest.raises(SparkInputError, match=r"label_col='y'.*3 outputs"):
        preflight.check_sample(_torch_net(0), DataSet(x[:2], np.zeros((2, 5), np.float32)), "y")
    dense = Network([Dense(4), Output(3)], input_shape=(8,), seed=0)
    preflight.check_sample(dense, DataSet(x[:2], y[:2]))


def test_missing_columns_name_the_option() -> None:
    preflight.check_columns(["features", "label"], "features", "label")
    with pytest.raises(SparkInputError, match=r"no column 'pixels' \(features_col='pixels'\)"):
        preflight.check_columns(["features", "label"], "pixels", "label")
    with pytest.raises(SparkInputError, match=r"label_col='y'"):
        preflight.check_columns(["features", "label"], "features", "y")


_SPARK_TEXT = """An error occurred while calling o123.collect.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 4.0 failed 4 times
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/pyspark/worker.py", line 1, in main
    process()
  File "/x/psrv/spark/driver/shared_training.py", line 9, in train
    raise SparkInputError("expected RDD elements of type DataSet, got str")
psrv.spark.errors.SparkInputError: expected RDD elements of type DataSet, got str

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:2)
"""


def test_worker_error_is_the_first_line_with_the_spark_trace_after_it() -> None:
    found = find_worker_error(RuntimeError(_SPARK_TEXT))
    assert found is not None and found.first_line() == \
        "SparkInputError: expected RDD elements of type DataSet, got str"
    with pytest.raises(SparkInputError) as info, worker_errors("fit"):
        try:
            raise RuntimeError(_SPARK_TEXT)
        except RuntimeError as spark_error:
            raise TrainingJobError("gradient-sharing job failed") from spark_error
    lines = str(info.value).splitlines()
    assert lines[0] == "SparkInputError: expected RDD elements of type DataSet, got str"
    assert any("PythonRunner.scala" in line for line in lines[1:])
    trace = 'Traceback (most recent call last):\n  File "a", line 1\nValueError: bad value\n'
    with pytest.raises(TrainingJobError, match=r"^ValueError: bad value"), worker_errors("fit"):
        raise RuntimeError(trace)
    with pytest.raises(KeyError), worker_errors("fit"):  # nothing from a worker in it: left alone
        raise KeyError("plain")
