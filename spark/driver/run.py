"""``psrv.spark.run(train_fn, *args, num_workers=N)``: the user's training function on N Spark tasks.

TorchDistributor's shape, psrv's protocol: the driver holds the rendezvous and, once rank 0 sent its
initial parameters, the controller (the master copy); each task of one barrier stage (all N run at once)
runs ``train_fn`` with its place in the environment (psrv.spark.task.run_task). The function, its
arguments and its closure ship as PySpark ships functions (by value when defined in ``__main__`` or a
notebook; a module the executors cannot import is refused here, before the job). A worker that raises
stops the job and its own exception is raised here; ``run`` returns rank 0's value and the master copy.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from psrv.spark.driver.crowded_hosts import CrowdingWarnings
from psrv.spark.driver.job_errors import worker_errors
from psrv.spark.driver.shipping import check_shippable
from psrv.spark.task.run_task import RunTask
from psrv.torch.launch import RunResult, check_workers, raise_failure
from psrv.torch.rendezvous import Rendezvous
from psrv.torch.worker import dump_call
from psrv.transport import TransportConfig

log = logging.getLogger(__name__)

#: how long the job thread gets to end once the job was cancelled
CANCEL_WAIT_S = 30.0


def _spark_context(spark: Any) -> Any:
    from pyspark import SparkContext  # lazy: pyspark's JVM gateway only when a job runs

    if spark is None:
        return SparkContext.getOrCreate()
    return getattr(spark, "sparkContext", spark)


def run(train_fn: Callable[..., Any], *args: Any, num_workers: int = 2, spark: Any = None,
        transport: TransportConfig | None = None, job: str = "psrv", **kwargs: Any) -> RunResult:
    """Run ``train_fn(*args, **kwargs)`` on ``num_workers`` Spark tasks sharing their steps.

    Inside, the function calls ``psrv.torch.init()`` (optional) and wraps its optimizer in
    ``psrv.torch.DistributedOptimizer``. ``spark``: a SparkSession or SparkContext (default: the active
    one). The cluster needs ``num_workers`` free task slots (a barrier stage starts all tasks at once).
    """
    num_workers = check_workers(num_workers, train_fn)
    sc = _spark_context(spark)
    check_shippable((train_fn, args, kwargs), "psrv.spark.run: train_fn", sc)
    payload = dump_call(train_fn, args, kwargs)
    CrowdingWarnings().before_job(str(sc.master), num_workers)  # all tasks at once: a barrier stage
    host = sc.getConf().get("spark.driver.host") or "127.0.0.1"
    hub = Rendezvous(num_workers, transport or TransportConfig(), host=host)
    task = RunTask(payload, hub.environment(0, job=job))
    group = f"psrv-run-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}

    def spark_job() -> None:
        sc.setJobGroup(group, f"psrv.spark.run: {getattr(train_fn, '__name__', 'train_fn')} on "
                              f"{num_workers} workers", interruptOnCancel=True)
        try:
            outcome["ranks"] = sc.parallelize(range(num_workers), num_workers).barrier() \
                .mapPartitions(task).collect()
        except BaseException as exc:  # raised on the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=spark_job, name="psrv-spark-run", daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            if hub.wait(0.5) and hub.failure is not None:
                log.info("rank %d failed: cancelling the job", hub.failure.rank)
                sc.cancelJobGroup(group)
                break
        thread.join(CANCEL_WAIT_S)
        if hub.failure is not None:
            raise_failure(hub.failure)
        if "error" in outcome:
            with worker_errors("psrv.spark.run"):
                raise outcome["error"]
        return RunResult.from_hub(hub, num_workers)
    finally:
        hub.close()


__all__ = ["CANCEL_WAIT_S", "run"]
