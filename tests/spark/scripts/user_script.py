"""A user's own script: its nn.Module, loss and loader classes live here, in ``__main__``.

Run by tests/spark/test_user_path.py through ``spark-submit --master local-cluster[2,1,1024]``, as a
user would run it; writes what it saw as JSON to the path given as its argument. Each check is the
issue 12 failure it guards against: (1) classes of ``__main__`` reach the executors, and a module
only next to the script is refused on the driver until it is shipped; (2) a second network of the same
architecture fits in the same session and Python workers; (3) wrong inputs fail on the driver with one
clear line, and a worker's psrv error is the first line of what the user sees.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np
import torch
from psrv.nn import TorchNetwork
from psrv.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork, VoidConfiguration
from pyspark.sql import SparkSession
from torch import nn


class SmallNet(nn.Module):
    """The user's own model class (pickled by reference it would not exist on the executors)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def make_network(seed: int) -> TorchNetwork:
    return TorchNetwork(SmallNet(), nn.CrossEntropyLoss(), (8,),
                        optimizer=lambda params: torch.optim.Adam(params, lr=1e-2), seed=seed)


def frame(spark: SparkSession):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)
    rows = [([float(v) for v in row], int(label)) for row, label in zip(x, y, strict=True)]
    return spark.createDataFrame(rows, ["features", "label"]).repartition(2)


def attempt(spark: SparkSession, results: dict, name: str, action) -> None:
    """Run one check in its own job group; record its value or the error and the jobs it started."""
    sc = spark.sparkContext
    sc.setJobGroup(name, name)
    try:
        results[name] = {"ok": True, "value": action()}
    except Exception as exc:  # noqa: BLE001 - the test reads what the user would have seen
        results[name] = {"ok": False, "type": type(exc).__name__, "error": str(exc)[:4000],
                         "trace": traceback.format_exc()[-2000:]}
    results[name]["jobs"] = len(sc.statusTracker().getJobIdsForGroup(name))
    sc.setJobGroup("other", "other")


class LockedLoader:
    """A loader holding a lock: it cannot be pickled."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def load(self, path: str):  # pragma: no cover - never reached
        raise AssertionError(path)


def main(out: str) -> None:
    spark = SparkSession.builder.appName("psrv-user-script").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    data = frame(spark)
    results: dict = {}
    masters = {
        "shared": lambda: SharedTrainingMaster(VoidConfiguration(unicast_port=0, heartbeat_ms=500),
                                               batch_size_per_worker=16),
        "averaging": lambda: ParameterAveragingTrainingMaster(batch_size_per_worker=16,
                                                              averaging_frequency=2),
    }
    for name, master in masters.items():
        def fit_two(master=master) -> dict:
            first, second = make_network(1), make_network(2)
            before = second.params.copy()
            SparkNetwork(spark, first, master()).fit(data)
            SparkNetwork(spark, second, master()).fit(data)  # a fresh network of the same architecture
            SparkNetwork(spark, first, master()).fit(data)   # the first one again, re-used
            return {"second_changed": bool(np.any(second.params != before)),
                    "distinct": bool(np.any(first.params != second.params)),
                    "finite": bool(np.isfinite(first.params).all() and np.isfinite(second.params).all())}

        attempt(spark, results, f"refit_{name}", fit_two)

    def shared() -> SharedTrainingMaster:
        return masters["shared"]()

    def helper_module() -> str:
        from user_layers import ScaledNet  # found through this script's folder, on the driver only

        net = TorchNetwork(ScaledNet(), nn.CrossEntropyLoss(), (8,), seed=0)
        SparkNetwork(spark, net, shared()).fit(data)
        return "fitted"

    attempt(spark, results, "helper_module_unshipped", helper_module)
    import user_layers

    spark.sparkContext.addPyFile(user_layers.__file__)
    attempt(spark, results, "helper_module_shipped", helper_module)

    def big_batch() -> None:
        master = SharedTrainingMaster(VoidConfiguration(unicast_port=0), batch_size_per_worker=5000)
        SparkNetwork(spark, make_network(0), master).fit(data)

    attempt(spark, results, "batch_too_large", big_batch)

    def wrong_input_shape() -> None:
        module = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
        net = TorchNetwork(module, nn.CrossEntropyLoss(), (1, 8, 8), seed=0)
        SparkNetwork(spark, net, shared()).fit(data)

    attempt(spark, results, "wrong_input_shape", wrong_input_shape)
    attempt(spark, results, "missing_column",
            lambda: SparkNetwork(spark, make_network(0), shared(), features_col="pixels").fit(data))
    paths = spark.sparkContext.parallelize(["/nonexistent/a.npz", "/nonexistent/b.npz"], 2)
    attempt(spark, results, "locked_loader",
            lambda: SparkNetwork(spark, make_network(0), shared()).fit_paths(paths, LockedLoader()))
    attempt(spark, results, "loader_without_load",
            lambda: SparkNetwork(spark, make_network(0), shared()).fit_paths(paths, object()))
    bad_labels = data.selectExpr("features", "label * 3 AS label")  # classes 0..6 for 3 outputs
    attempt(spark, results, "worker_error",
            lambda: SparkNetwork(spark, make_network(0), shared(), check_data=False).fit(bad_labels))
    with open(out, "w") as fh:
        json.dump(results, fh)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
