"""psrv.spark.run on the real local-cluster: the user's own-loop script (AdamW + cosine schedule +
clipping + accumulation) on 2 Spark tasks with the controller on the driver, a Lightning Trainer with
psrv's strategy on 2 tasks, and a worker that raises coming back as the user's own exception."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import psrv.spark  # noqa: E402
from own_loop_checks import SCRIPT, check_own_loop_run  # noqa: E402
from psrv.torch.worker import run_script  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def summary(result) -> tuple[list[dict], dict]:
    workers = [{**report, "replica": report["replica"]["status"]} for report in result.reports]
    return workers, {str(k): v for k, v in result.counters["applied_by_origin"].items()}


@pytest.mark.timeout(400)
def test_spark_run_trains_a_users_own_loop(spark, tmp_path: Path) -> None:
    result = psrv.spark.run(run_script, str(SCRIPT), ["--out", str(tmp_path), "--steps", "80"],
                            num_workers=2, spark=spark)
    workers, applied = summary(result)
    assert [w["rank"] for w in workers] == [0, 1]
    check_own_loop_run(tmp_path, workers, applied, result.params)


@pytest.mark.timeout(500)
def test_spark_run_fits_a_lightning_module_with_the_psrv_strategy(spark) -> None:
    pytest.importorskip("lightning")
    import test_lightning_strategy as lightning_run
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(lightning_run)  # the executors cannot import the test module
    try:
        result = psrv.spark.run(lightning_run.train_with_psrv, num_workers=2, spark=spark)
    finally:
        cloudpickle.unregister_pickle_by_value(lightning_run)
    lightning_run.check_lightning_run(result)


@pytest.mark.timeout(500)
def test_spark_run_returns_the_workers_exception(spark) -> None:
    def train(message: str) -> None:
        import psrv.torch as pt

        pt.init()
        model = torch.nn.Linear(4, 2)
        optimizer = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        if pt.rank() == 1:
            raise KeyError(f"{message} (raised at {time.time():.3f})")
        deadline = time.monotonic() + 240  # rank 0 trains on until the job is cancelled
        while time.monotonic() < deadline:
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
            time.sleep(0.01)

    with pytest.raises(KeyError, match="no column 'label'") as info:
        psrv.spark.run(train, "no column 'label'", num_workers=2, spark=spark)
    # from the worker's raise to the launcher's (the tasks' start-up, minutes on a loaded machine, is
    # not counted): the job was cancelled at once, not given up after the launcher's 30 s wait for it
    since_raise = time.time() - float(re.search(r"raised at ([0-9.]+)", str(info.value)).group(1))
    assert since_raise < 20, since_raise
    # the cluster is free again: a next job runs at once
    assert spark.sparkContext.parallelize(range(4), 2).count() == 4
