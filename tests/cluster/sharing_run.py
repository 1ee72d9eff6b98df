"""The gradient-sharing fits of the namespace cluster's fault checks, run inside the one application
that tests/cluster/test_netns_cluster.py submits with ``spark-submit`` after README's first example
(shipped with ``--py-files``, so the driver and the executors import it as ``sharing_run``).

``fault_fits(spark, out_dir, marks_dir, mask, *phases)`` runs one fit per phase ``NAME:PACE_S:STEP:EPOCHS``,
one after the other: two partitions of a separable two-class problem, trained by
``SharedTrainingMaster`` with ``network_mask=MASK`` (every process binds the address of its host
inside MASK, not the decoy), the export approach on the cluster's default file system (S3) and
checkpoints on S3. In the first epoch every step sleeps PACE_S (so a fault lands mid-fit), and
partition 0's first attempt writes the address of its host to ``MARKS_DIR/NAME/mark`` at step STEP,
then waits (at most ``GO_DEADLINE_S``) for ``MARKS_DIR/NAME/go``: the test cuts or kills that host in
between, so the fault lands at that step however late the test sees the mark. Each phase writes
``OUT_DIR/NAME.json``: every epoch's ``last_fit``, the controller's address, the checkpoints, the
accuracy of the trained network on the data against what a constant guess gets, the number of
examples, or the error that ended it (the next phase runs either way).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time

import numpy as np
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet
from psrv.spark import SparkNetwork, storage
from psrv.spark.config import VoidConfiguration
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.task.node import route_source_address

ROWS, FEATURES = 2400, 8
GO_DEADLINE_S = 60.0


def pace(marks: str, pace_s: float, mark_step: int, driver: str, steps: int) -> None:
    """After each step of the first epoch: at MARK_STEP (partition 0, first attempt) the mark and the
    wait for the test's go, then a sleep."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if steps == mark_step and context is not None and context.partitionId() == 0 \
            and context.attemptNumber() == 0:
        scratch = os.path.join(marks, f".mark-{os.getpid()}")
        with open(scratch, "w") as out:
            out.write(route_source_address(f"{driver}:9") or "")
        with contextlib.suppress(FileExistsError):  # the first one only, complete when seen
            os.link(scratch, os.path.join(marks, "mark"))
        deadline = time.monotonic() + GO_DEADLINE_S
        while not os.path.exists(os.path.join(marks, "go")) and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(pace_s)


class PacedMaster(SharedTrainingMaster):
    """Gradient sharing whose first epoch's tasks run ``pace`` after every step."""

    first_epoch_step: functools.partial | None = None

    def task_trainer(self, setup, loader):
        trainer = super().task_trainer(setup, loader)
        trainer.on_step, self.first_epoch_step = self.first_epoch_step, None
        return trainer


class Record:
    """Keeps every epoch's ``last_fit`` (the fit itself only keeps the last one)."""

    def __init__(self, master: SharedTrainingMaster) -> None:
        self.master, self.fits = master, []

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        live = getattr(self.master, "_live", None)  # the controller this fit call keeps
        self.fits.append(dict(self.master.last_fit, epoch=epoch, loss=metrics.get("loss"),
                              controller=getattr(live, "address", None)))


def fault_fit(spark, out: str, marks: str, mask: str, pace_s: float, mark_step: int, epochs: int) -> None:
    """One paced fit (see the module docstring); writes OUT."""
    sc = spark.sparkContext
    rng = np.random.default_rng(3)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] + 0.5 * x[:, 2] > 0).astype(np.int64)
    data = DataSet(x, np.eye(2, dtype=np.float32)[y])
    rdd = sc.parallelize(list(data.batches(48)), 2)
    master = PacedMaster(VoidConfiguration(network_mask=mask), batch_size_per_worker=16,
                         rdd_training_approach="export")
    master.first_epoch_step = functools.partial(pace, marks, pace_s, mark_step,
                                                sc.getConf().get("spark.driver.host"))
    network = Network([Dense(16, activation="relu"), Output(2)], input_shape=(FEATURES,), updater=Adam(1e-2),
                      seed=4)
    record = Record(master)
    name = os.path.splitext(os.path.basename(out))[0]
    checkpoints = f"{sc._jsc.hadoopConfiguration().get('fs.defaultFS')}/checkpoints/{name}"
    result: dict = {}
    try:
        with SparkNetwork(sc, network, master) as net:
            started = time.monotonic()
            net.fit(rdd, epochs=epochs, checkpoint_dir=checkpoints, callbacks=[record])
            result["fit_s"] = time.monotonic() - started
            predicted = np.asarray(network.predict(x)).reshape(-1)
        result["accuracy"] = float(np.mean(predicted == y))
        result["majority"] = float(max(np.mean(y), 1 - np.mean(y)))
        result["rows"], result["predicted"] = ROWS, int(predicted.size)
        result["checkpoints"] = storage.list_files(checkpoints)
    except Exception as exc:  # noqa: BLE001 - reported to the test with what was recorded
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["fits"] = record.fits
    with open(out, "w") as sink:
        json.dump(result, sink, default=str)


def fault_fits(spark, out_dir: str, marks_dir: str, mask: str, *phases: str) -> None:
    """``fault_fit`` for each ``NAME:PACE_S:STEP:EPOCHS``, in order."""
    for phase in phases:
        name, pace_s, mark_step, epochs = phase.split(":")
        marks = os.path.join(marks_dir, name)
        os.makedirs(marks, exist_ok=True)
        fault_fit(spark, os.path.join(out_dir, f"{name}.json"), marks, mask, float(pace_s), int(mark_step),
                  int(epochs))


__all__ = ["fault_fit", "fault_fits"]
