"""Metrics sinks: the derivation of a fit's metrics, and real TensorBoard event files / MLflow stores."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from psrv.encoding import encode_counted
from psrv.spark.errors import SparkConfigError
from psrv.spark.observe.metrics import (
    check_loggers,
    elements_sent,
    emit,
    group_calls,
    log_validation,
    master_metrics,
    publish_shared_fit,
    worker_step_metrics,
)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, dict[str, float]]] = []

    def on_metrics(self, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.calls.append((step, epoch, dict(metrics)))


def _events(partition: int, first: int, steps: int, n: int) -> list[dict]:
    out = []
    for i in range(steps):
        it = first + i + 1
        out.append({"worker": f"h:{partition}", "partition": partition, "kind": "fit", "start": 0.0,
                    "end": 1.0, "iteration": it, "loss": 1.0 / it, "examples": 8})
        out.append({"worker": f"h:{partition}", "partition": partition, "kind": "encode", "start": 1.0,
                    "end": 2.0, "iteration": it, "threshold": 1e-3, "bytes": 64 + i, "elements": 10 + i,
                    "sparsity": (10 + i) / n})
    out.append({"worker": f"h:{partition}", "partition": partition, "kind": "metrics", "time": 3.0,
                "iteration": first + steps, "bytes_received": 1000, "bytes_sent_total": 900,
                "updates_applied": 7})
    return out


@pytest.mark.parametrize("density", [0.001, 0.5])
def test_elements_sent_counts_both_wire_forms(density: float) -> None:
    rng = np.random.default_rng(3)
    residual = rng.standard_normal(10_000).astype(np.float32)
    tau = float(np.quantile(np.abs(residual), 1 - density))
    expected = int(np.count_nonzero(np.abs(residual) >= np.float32(tau)))
    message, count = encode_counted(residual, tau)
    assert count == expected
    form = int(message[3])
    assert form == (0 if density < 0.01 else 1)  # both forms are exercised
    assert elements_sent(message) == expected
    # true sparsity is elements / parameters, not message words / parameters
    assert elements_sent(message) / residual.size != pytest.approx(message.size / residual.size)


def test_worker_step_metrics_and_grouping() -> None:
    n = 1000
    events = _events(0, 100, 3, n) + _events(1, 100, 2, n)
    per_step = worker_step_metrics(events)
    assert sorted(per_step) == [101, 102, 103]
    assert per_step[101]["worker/p0/loss"] == pytest.approx(1 / 101)
    assert per_step[101]["worker/p1/sparsity"] == pytest.approx(10 / n)
    assert per_step[102]["worker/p1/updates_applied"] == 7  # p1's totals at its last step
    assert per_step[103]["worker/p0/bytes_received"] == 1000
    calls = group_calls(per_step, 4, 103, {"master/loss": 0.5})
    assert [c[0] for c in calls] == [101, 102, 103]
    assert all(c[1] == 4 for c in calls)
    assert calls[-1][2]["master/loss"] == 0.5


def test_master_metrics_and_publish() -> None:
    n = 1000
    results = [SimpleNamespace(events=_events(0, 0, 4, n)), SimpleNamespace(events=_events(1, 0, 4, n))]
    summary = {"score": 0.25, "threshold": 1e-3, "workers": 2, "examples": 64,
               "controller_updates_applied": 8, "updates_missing": 0}
    counters = {"bytes_out": 5000, "bytes_in": 7000}
    sink = Recorder()
    network = SimpleNamespace(iteration=4, num_params=n)
    publish_shared_fit([sink], network, 0, results, summary, counters, 2.0)
    last = sink.calls[-1]
    assert last[0] == 4
    metrics = last[2]
    assert metrics["master/loss"] == 0.25
    assert metrics["master/bytes_sent"] == 5000 and metrics["master/bytes_received"] == 7000
    assert metrics["master/updates_applied"] == 8
    assert metrics["master/examples_per_s"] == pytest.approx(32.0)
    # elements 10..13 on each of 8 encodes over 1000 parameters
    assert metrics["master/sparsity"] == pytest.approx((10 + 11 + 12 + 13) * 2 / (8 * n))
    assert master_metrics({"score": float("nan")}) == {}


def test_emit_skips_non_finite_and_survives_a_failing_sink(caplog) -> None:
    class Broken:
        def on_metrics(self, step, epoch, metrics):
            raise RuntimeError("disk full")

    good = Recorder()
    emit([Broken(), good], [(1, 0, {"a": 1.0, "b": math.inf}), (2, 0, {"a": float("nan")}), (3, 0, {"a": 2})])
    assert good.calls == [(1, 0, {"a": 1.0}), (3, 0, {"a": 2.0})]
    assert sum("disk full" in r.getMessage() for r in caplog.records) == 1


def test_check_loggers_rejects_what_has_no_on_metrics() -> None:
    sink = Recorder()
    assert check_loggers(None) == []
    assert check_loggers(sink) == [sink]
    assert check_loggers([sink, sink]) == [sink, sink]
    with pytest.raises(SparkConfigError, match="on_metrics"):
        check_loggers(["tensorboard"])
    with pytest.raises(SparkConfigError, match="on_metrics"):
        check_loggers("tensorboard")


def test_log_validation_takes_an_evaluation_or_a_dict() -> None:
    from psrv.nn.evaluation import Evaluation

    evaluation = Evaluation(num_classes=3)
    labels = np.eye(3, dtype=np.float32)[[0, 1, 2, 2]]
    predictions = np.eye(3, dtype=np.float32)[[0, 1, 2, 1]]
    evaluation.eval(labels, predictions)
    sink = Recorder()
    sent = log_validation([sink], 10, 1, evaluation)
    assert sent["accuracy"] == pytest.approx(0.75)
    assert sink.calls[0][0] == 10 and sink.calls[0][2]["validation/accuracy"] == pytest.approx(0.75)
    log_validation(sink, 11, 1, {"auc": 0.9})
    assert sink.calls[1][2] == {"validation/auc": 0.9}


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in tags}


def test_tensorboard_logger_writes_event_files_tensorboard_reads(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from psrv.spark.observe.metrics import TensorBoardLogger

    logger = TensorBoardLogger(str(tmp_path / "tb"))
    emit([logger], [(1, 0, {"master/loss": 0.5, "worker/p0/sparsity": 0.01}), (2, 0, {"master/loss": 0.25})])
    logger.close()
    scalars = _scalars(tmp_path / "tb")
    assert scalars["master/loss"] == [(1, 0.5), (2, 0.25)]
    assert scalars["worker/p0/sparsity"] == [(1, pytest.approx(0.01))]
    assert [step for step, _ in scalars["epoch"]] == [1, 2]


def test_mlflow_logger_writes_a_local_file_store(tmp_path: Path, monkeypatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    # MLflow 3 keeps the file store in maintenance mode behind this switch (sqlite needs SQLAlchemy)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from psrv.spark.observe.metrics import MLflowLogger

    uri = (tmp_path / "mlruns").as_uri()
    logger = MLflowLogger(tracking_uri=uri, experiment="psrv-test", run_name="unit")
    emit([logger], [(1, 1, {"master/loss": 0.5}), (2, 2, {"master/loss": 0.25, "worker/p0/loss": 0.3})])
    logger.close()
    client = mlflow.MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(logger.run_id, "master/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]
    epochs = client.get_metric_history(logger.run_id, "epoch")
    assert sorted((m.step, m.value) for m in epochs) == [(1, 1.0), (2, 2.0)]  # epochs count from 1
    assert client.get_run(logger.run_id).info.status == "FINISHED"
