"""A user's own script: its nn.Module, loss and loader classes live here, in ``__main__``.

Run through ``spark-submit --master local-cluster[2,1,1024]``, as a user would run it, once for the tests
of tests/spark/test_user_path.py and tests/spark/test_fit_failures.py (one Spark application, one start
of its local cluster); writes what it saw as JSON to the path given as its argument: ``{"failing": ...,
"user": ...}``.

``failing``, run first: fits that go wrong. Its module's forward raises (gradient sharing, then parameter
averaging), its data holds a NaN, its input_shape is wrong; and one fit that goes right, whose progress
lines are checked against the data. Each records what it raised (type, message, seconds); the progress
lines go to stderr (spark-submit passes it on in its stdout), each check's end marked by a
``--- name finished ---`` line.

``user``: each check is the failure it guards against: (1) classes of ``__main__`` reach the executors,
and a module only next to the script is refused on the driver until it is shipped; (2) a second network
of the same architecture fits in the same session and Python workers; (3) wrong inputs fail on the
driver with one clear line, and a worker's psrv error is the first line of what the user sees. Its own
threshold algorithm and residual post-processor (the encoding strategies' Protocols) train on the
executors and resume from a checkpoint with their state; a class missing a member is refused on the
driver.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from psrv.nn import TorchNetwork
from psrv.nn.data import DataSet
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


class HalvingThreshold:
    """The user's own threshold algorithm: tau halves every ``every`` steps; counts the steps it saw."""

    def __init__(self, tau: float = 0.05, every: int = 4) -> None:
        self.tau, self.every = tau, every
        self.threshold = tau
        self.steps = 0

    def observe(self, count: int, n: int) -> None:
        self.steps += 1
        if self.steps % self.every == 0:
            self.threshold /= 2

    def get_state(self) -> dict:
        return {"tau": self.tau, "every": self.every, "threshold": self.threshold, "steps": self.steps}

    @classmethod
    def from_state(cls, state: dict) -> HalvingThreshold:
        algorithm = cls(state["tau"], state["every"])
        algorithm.threshold, algorithm.steps = state["threshold"], state["steps"]
        return algorithm

    @classmethod
    def average(cls, states: list) -> HalvingThreshold:
        states = [s.get_state() if isinstance(s, cls) else s for s in states]
        return cls.from_state({**states[0], "threshold": min(s["threshold"] for s in states),
                               "steps": max(s["steps"] for s in states)})


class Damping:
    """The user's own residual post-processor: scales the residual by ``keep`` after each step."""

    def __init__(self, keep: float = 0.99) -> None:
        self.keep = keep

    def process(self, residual, threshold: float) -> None:
        residual *= self.keep

    def get_state(self) -> dict:
        return {"keep": self.keep}

    @classmethod
    def from_state(cls, state: dict) -> Damping:
        return cls(state["keep"])


class NoAverage(HalvingThreshold):
    """Not a ThresholdAlgorithm: ``average`` is missing."""

    average = None  # type: ignore[assignment]


class LockedLoader:
    """A loader holding a lock: it cannot be pickled."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def load(self, path: str):  # pragma: no cover - never reached
        raise AssertionError(path)


def user_checks(spark: SparkSession) -> dict:
    """The user's own classes on the executors, refits, and wrong inputs refused on the driver."""
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

    def own_strategies() -> dict:
        checkpoints = tempfile.mkdtemp(prefix="psrv-user-ckpt-")

        def master(tau: float = 0.05) -> SharedTrainingMaster:
            return SharedTrainingMaster(VoidConfiguration(unicast_port=0, heartbeat_ms=500),
                                        batch_size_per_worker=16, threshold_algorithm=HalvingThreshold(tau),
                                        residual_post_processor=Damping(0.995))

        first_master, net = master(), make_network(5)
        SparkNetwork(spark, net, first_master).fit(data, epochs=1, checkpoint_dir=checkpoints)
        trained = first_master.threshold_algorithm.get_state()
        loaded = master(tau=0.3)  # a fresh run resuming: the checkpoint's state replaces its own
        SparkNetwork(spark, make_network(5), loaded).fit(data, epochs=1, checkpoint_dir=checkpoints,
                                                         resume=True)
        continued = master(tau=0.3)
        SparkNetwork(spark, make_network(5), continued).fit(data, epochs=2, checkpoint_dir=checkpoints,
                                                            resume=True)
        return {"trained": trained, "workers": first_master.last_fit["workers"],
                "resumed": loaded.threshold_algorithm.get_state(),
                "resumed_class": type(loaded.threshold_algorithm).__name__,
                "post_processor": [type(loaded.residual_post_processor).__name__,
                                   loaded.residual_post_processor.get_state()],
                "continued": continued.threshold_algorithm.get_state(),
                "finite": bool(np.isfinite(net.params).all())}

    attempt(spark, results, "own_strategies", own_strategies)
    attempt(spark, results, "strategy_without_average",
            lambda: SparkNetwork(spark, make_network(0), SharedTrainingMaster(
                VoidConfiguration(unicast_port=0), threshold_algorithm=NoAverage())).fit(data))
    return results



class LinearNet(nn.Module):
    """The failing fits' model: one linear layer."""

    def __init__(self, inputs: int = 8) -> None:
        super().__init__()
        self.layer = nn.Linear(inputs, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def note_attempt(path: str) -> None:
    """Append this task attempt (partition, attempt, wall-clock time) to a file beside the script."""
    from pyspark import TaskContext

    context = TaskContext.get()
    with open(path, "a") as out:
        out.write(f"{context.partitionId()} {context.attemptNumber()} {time.time():.3f}\n")


class NotingNet(LinearNet):
    """A LinearNet that notes each training forward's task attempt (see note_attempt)."""

    def __init__(self, attempts: str) -> None:
        super().__init__()
        self.attempts = attempts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            note_attempt(self.attempts)
        return super().forward(x)


class RaisingNet(NotingNet):
    """Runs on the driver's sample check (evaluation mode), raises as soon as it trains, and notes each
    task attempt that reached it (partition, attempt, wall-clock time of the raise) in a file beside the
    script."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)  # (noted when training)
        if self.training:
            raise ValueError("boom from the user's forward")
        return out


def linear_network(module: nn.Module, input_shape: tuple[int, ...] = (8,)) -> TorchNetwork:
    return TorchNetwork(module, nn.CrossEntropyLoss(), input_shape,
                        optimizer=lambda params: torch.optim.SGD(params, lr=0.05), seed=3)


def failing_master(**kwargs) -> SharedTrainingMaster:
    return SharedTrainingMaster(VoidConfiguration(heartbeat_ms=500), batch_size_per_worker=16, **kwargs)


def element_datasets(nan_at: tuple[int, int] | None = None) -> list[DataSet]:
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


def timed_attempt(results: dict, name: str, action) -> None:
    started = time.monotonic()
    try:
        results[name] = {"ok": True, "value": action()}
    except Exception as exc:  # noqa: BLE001 - the test reads what the user would have seen
        results[name] = {"ok": False, "type": type(exc).__name__, "error": str(exc)[:4000]}
    results[name]["seconds"] = time.monotonic() - started
    results[name]["ended_at"] = time.time()  # the wall clock the executors' notes use (one host)
    print(f"--- {name} finished ---", file=sys.stderr, flush=True)


def failing_fits(spark: SparkSession, out: str) -> dict:
    """The fits that go wrong, and the good one whose progress lines the test reads."""
    sc = spark.sparkContext
    results: dict = {}
    rdd = sc.parallelize(element_datasets(), 2)

    steps: list[int] = []
    good = failing_master(progress=True)

    def progress_fit() -> dict:
        spark_net = SparkNetwork(sc, linear_network(LinearNet()), good)
        spark_net.fit(rdd, epochs=2, callbacks=[lambda epoch, metrics: steps.append(good.last_fit["steps"])])
        return {"steps": steps, "examples": 240}

    timed_attempt(results, "progress", progress_fit)

    def raising_fit(attempts: Path, master) -> None:
        SparkNetwork(sc, linear_network(RaisingNet(str(attempts))), master).fit(rdd)

    attempts = Path(out).with_name("attempts.txt")
    timed_attempt(results, "user_code", lambda: raising_fit(attempts, failing_master(progress=True)))
    results["user_code"]["attempts"] = attempts.read_text().split("\n")[:-1] if attempts.exists() else []
    averaged = Path(out).with_name("attempts-averaging.txt")  # the same module, parameter averaging
    timed_attempt(results, "user_code_averaging", lambda: raising_fit(
        averaged, ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2)))
    results["user_code_averaging"]["attempts"] = \
        averaged.read_text().split("\n")[:-1] if averaged.exists() else []
    # partition 1 holds elements 6..11: element 7's row 4 is row 24 of partition 1
    with_nan = sc.parallelize(element_datasets(nan_at=(7, 4)), 2)
    timed_attempt(results, "nan_before",
                  lambda: SparkNetwork(sc, linear_network(LinearNet()), failing_master()).fit(with_nan))
    noted = Path(out).with_name("attempts-nan.txt")  # each training forward before the NaN's batch
    timed_attempt(results, "nan_during", lambda: SparkNetwork(
        sc, linear_network(NotingNet(str(noted))), failing_master(), check_data=False).fit(with_nan))
    results["nan_during"]["attempts"] = noted.read_text().split("\n")[:-1] if noted.exists() else []
    timed_attempt(results, "shape",
                  lambda: SparkNetwork(sc, linear_network(LinearNet(4), (4,)), failing_master()).fit(rdd))
    return results


def main(out: str) -> None:
    spark = SparkSession.builder.appName("psrv-user-script").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    results = {"failing": failing_fits(spark, out)}  # first: the test reads its progress lines by marker
    results["user"] = user_checks(spark)
    Path(out).write_text(json.dumps(results))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
