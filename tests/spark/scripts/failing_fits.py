"""A user's script whose fits go wrong: its module's forward raises (gradient sharing, then parameter
averaging), its data holds a NaN, its input_shape
is wrong; and one fit that goes right, whose progress lines are checked against the data.

Run by tests/spark/test_fit_failures.py through ``spark-submit --master local-cluster[2,1,1024]``, as a
user would run it; writes what each fit raised (type, message, seconds) as JSON to the path given as its
first argument. The progress lines go to stderr (spark-submit passes it on in its stdout), which the
test reads.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from psrv.nn import TorchNetwork
from psrv.nn.data import DataSet
from psrv.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork, VoidConfiguration
from pyspark.sql import SparkSession
from torch import nn


class SmallNet(nn.Module):
    def __init__(self, inputs: int = 8) -> None:
        super().__init__()
        self.layer = nn.Linear(inputs, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class RaisingNet(SmallNet):
    """Runs on the driver's sample check (evaluation mode), raises as soon as it trains, and notes each
    task attempt that reached it in a file beside the script."""

    def __init__(self, attempts: str) -> None:
        super().__init__()
        self.attempts = attempts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            from pyspark import TaskContext

            context = TaskContext.get()
            with open(self.attempts, "a") as out:
                out.write(f"{context.partitionId()} {context.attemptNumber()}\n")
            raise ValueError("boom from the user's forward")
        return super().forward(x)


def network(module: nn.Module, input_shape: tuple[int, ...] = (8,)) -> TorchNetwork:
    return TorchNetwork(module, nn.CrossEntropyLoss(), input_shape,
                        optimizer=lambda params: torch.optim.SGD(params, lr=0.05), seed=3)


def master(**kwargs) -> SharedTrainingMaster:
    return SharedTrainingMaster(VoidConfiguration(heartbeat_ms=500), batch_size_per_worker=16, **kwargs)


def datasets(nan_at: tuple[int, int] | None = None) -> list[DataSet]:
    """12 DataSets of 20 rows (240 rows); ``nan_at=(element, row)`` puts a NaN in that row's features."""
    rng = np.random.default_rng(0)
    out = []
    for element in range(12):
        x = rng.normal(size=(20, 8)).astype(np.float32)
        if nan_at is not None and nan_at[0] == element:
            x[nan_at[1], 5] = np.nan
        y = np.eye(3, dtype=np.float32)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)]
        out.append(DataSet(x, y))
    return out


def attempt(results: dict, name: str, action) -> None:
    started = time.monotonic()
    try:
        results[name] = {"ok": True, "value": action()}
    except Exception as exc:  # noqa: BLE001 - the test reads what the user would have seen
        results[name] = {"ok": False, "type": type(exc).__name__, "error": str(exc)[:4000]}
    results[name]["seconds"] = time.monotonic() - started
    print(f"--- {name} finished ---", file=sys.stderr, flush=True)


def main(out: str) -> None:
    spark = SparkSession.builder.appName("psrv-failing-fits").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    results: dict = {}
    attempts = Path(out).with_name("attempts.txt")
    rdd = sc.parallelize(datasets(), 2)

    steps: list[int] = []
    good = master(progress=True)

    def progress_fit() -> dict:
        spark_net = SparkNetwork(sc, network(SmallNet()), good)
        spark_net.fit(rdd, epochs=2, callbacks=[lambda epoch, metrics: steps.append(good.last_fit["steps"])])
        return {"steps": steps, "examples": 240}

    attempt(results, "progress", progress_fit)
    attempt(results, "user_code", lambda: SparkNetwork(sc, network(RaisingNet(str(attempts))), master(
        progress=True)).fit(rdd))
    results["user_code"]["attempts"] = attempts.read_text().split("\n")[:-1] if attempts.exists() else []
    averaged = Path(out).with_name("attempts-averaging.txt")  # the same module, parameter averaging
    attempt(results, "user_code_averaging", lambda: SparkNetwork(sc, network(RaisingNet(str(averaged))),
            ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2)).fit(rdd))
    results["user_code_averaging"]["attempts"] = \
        averaged.read_text().split("\n")[:-1] if averaged.exists() else []
    # partition 1 holds elements 6..11: element 7's row 4 is row 24 of partition 1
    with_nan = sc.parallelize(datasets(nan_at=(7, 4)), 2)
    attempt(results, "nan_before", lambda: SparkNetwork(sc, network(SmallNet()), master()).fit(with_nan))
    attempt(results, "nan_during", lambda: SparkNetwork(sc, network(SmallNet()), master(), check_data=False)
            .fit(with_nan))
    attempt(results, "shape", lambda: SparkNetwork(sc, network(SmallNet(4), (4,)), master()).fit(rdd))
    Path(out).write_text(json.dumps(results))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
