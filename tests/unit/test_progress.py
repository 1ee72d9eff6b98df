"""Live progress: the derivation from heartbeat gauges and the formatting, without any timing."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

from psrv.spark.observe.progress import (
    LiveProgress,
    LossAverage,
    ProgressTracker,
    format_progress,
    report_progress,
)
from psrv.transport.counters import Counters


def _node(state: str, steps: int, examples: int, loss: float | None, out: int, epoch: int = 3,
          partition: int | None = None) -> dict:
    stats = {"train_steps": steps, "train_examples": examples, "train_bytes_out": out, "train_epoch": epoch}
    if partition is not None:
        stats["train_partition"] = partition
    if loss is not None:
        stats["train_loss"] = loss
    return {"state": state, "stats": stats}


def test_tracker_derives_rates_loss_and_workers() -> None:
    tracker = ProgressTracker(start=100.0)
    first = tracker.update(101.0, [_node("online", 1, 10, 2.0, 100), _node("online", 1, 30, 1.0, 300)],
                           {"updates_applied": 2, "bytes_out": 50})
    assert first.workers_online == 2 and first.epoch == 3
    assert first.examples == 40 and first.steps == 2
    assert first.examples_per_s is None and first.mesh_bytes_per_s is None  # no window yet
    assert math.isclose(first.loss, (2.0 * 10 + 1.0 * 30) / 40)  # weighted by examples
    assert first.mesh_bytes == 450 and first.updates_applied == 2
    second = tracker.update(103.0, [_node("online", 3, 50, 1.0, 600), _node("left", 2, 60, 1.0, 500)],
                            {"updates_applied": 5, "bytes_out": 150})
    assert second.workers_online == 1 and second.workers_seen == 2
    assert math.isclose(second.examples_per_s, (110 - 40) / 2.0)
    assert math.isclose(second.mesh_bytes_per_s, (1250 - 450) / 2.0)
    assert second.elapsed_s == 3.0
    overall = tracker.overall(second)
    assert math.isclose(overall.examples_per_s, 110 / 3.0)


def test_tracker_ignores_junk_gauges() -> None:
    view = ProgressTracker(0.0).update(1.0, [{"state": "online", "stats": {"train_loss": float("nan"),
                                                                          "train_examples": "many"}},
                                             {"state": "online"}], {})
    assert view.loss is None and view.examples == 0 and view.workers_online == 2 and view.epoch is None


def test_format_progress_names_every_quantity() -> None:
    tracker = ProgressTracker(0.0)
    tracker.update(1.0, [_node("online", 1, 100, 0.5, 1000)], {"updates_applied": 1})
    view = tracker.update(2.0, [_node("online", 2, 1334, 0.41234, 2_501_000)], {"updates_applied": 345})
    line = format_progress(view)
    assert line.startswith("1 worker online | epoch 3 | 2 steps, 1,334 examples | 1,234 ex/s | loss 0.4123")
    assert "mesh 2.5 MB/s" in line and "master applied 345 updates" in line
    empty = format_progress(ProgressTracker(0.0).update(0.0, [], {}))
    assert "0 workers online" in empty and "loss -" in empty and "- ex/s" in empty


def test_loss_average_and_worker_gauges() -> None:
    average = LossAverage(weight=0.5)
    assert average.add(float("nan")) is None
    assert average.add(2.0) == 2.0 and average.add(1.0) == 1.5
    node = SimpleNamespace(counters_=Counters())
    node.counters_.add("bytes_out", 77)
    report_progress(node, partition=1, epoch=2, steps=3, examples=48, loss=1.5)
    gauges = node.counters_.snapshot()
    assert {k: gauges[k] for k in ("train_partition", "train_epoch", "train_steps", "train_examples",
                                   "train_bytes_out", "train_loss")} == {
        "train_partition": 1, "train_epoch": 2, "train_steps": 3, "train_examples": 48,
        "train_bytes_out": 77, "train_loss": 1.5}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_live_progress_writes_plain_lines_off_a_terminal_and_a_closing_line() -> None:
    clock, stream = _Clock(), io.StringIO()
    snapshots = iter([([_node("online", i, 10 * i, 1.0, 0)], {"updates_applied": i}) for i in range(1, 100)])
    progress = LiveProgress(lambda: next(snapshots), stream=stream, interval_s=3600, log_every_s=10,
                            clock=clock, description="fit")
    with progress:
        clock.now = 5.0
        progress.poll()  # within log_every_s of the start: nothing written
        assert stream.getvalue() == ""
        clock.now = 11.0
        progress.poll()
        clock.now = 12.0
        progress.poll()  # 1 s after the last line: nothing
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("fit: 1 worker online")
    assert lines[1].startswith("fit done: 1 worker |") and "master applied 4 updates" in lines[1]


def test_live_progress_off_writes_nothing_and_survives_a_failing_source() -> None:
    stream = io.StringIO()
    with LiveProgress(lambda: ([], {}), enabled=False, stream=stream):
        pass
    assert stream.getvalue() == ""

    def broken():
        raise TimeoutError("controller busy")

    with LiveProgress(broken, stream=stream, interval_s=3600) as progress:
        assert progress.poll() is None
    assert stream.getvalue() == ""


def test_progress_setting_is_checked_on_the_driver() -> None:
    import pytest
    from psrv.spark.errors import SparkConfigError
    from psrv.spark.observe.progress import check_progress

    assert check_progress(True) is True and check_progress(False) is False and check_progress(None) is False
    assert check_progress(30) == 30.0
    for bad in ("yes", 0, -1, float("nan")):
        with pytest.raises(SparkConfigError, match="progress: expected True, False or seconds"):
            check_progress(bad)
    controller = SimpleNamespace(node_stats=lambda: [], counters_=Counters())
    assert LiveProgress.for_controller(controller, 30).log_every_s == 30.0
    assert LiveProgress.for_controller(controller, True).log_every_s == 10.0
    assert LiveProgress.for_controller(controller, False).enabled is False


def test_the_closing_line_counts_the_jobs_totals_when_no_beat_carried_them() -> None:
    """A short epoch ends before any heartbeat reached the controller: the closing line takes the
    steps and examples from the tasks' results instead of saying 0."""
    clock, stream = _Clock(), io.StringIO()
    progress = LiveProgress(lambda: ([], {"updates_applied": 7}), stream=stream, interval_s=3600,
                            log_every_s=10, clock=clock, description="fit")
    with progress:
        clock.now = 2.0
        progress.finish_with(steps=40, examples=640)
    closing = stream.getvalue().splitlines()[-1]
    assert closing.startswith("fit done:") and "40 steps, 640 examples" in closing
    assert "320 ex/s" in closing


def test_a_later_epoch_counts_its_own_workers_and_each_partition_once() -> None:
    """A controller kept for a whole fit still lists the departed nodes of earlier epochs, and a retried
    task's first attempt: epoch 2 of 2 partitions x 30 steps must read 60 steps (it read 260 before),
    2 workers, epoch 2, and its closing line must not say "0 workers online (6 seen)"."""
    nodes = [_node("left", 100, 1600, 1.0, 0, epoch=1, partition=0),
             _node("left", 100, 1600, 1.0, 0, epoch=1, partition=1),
             _node("offline", 12, 192, 1.0, 0, epoch=2, partition=0),  # the failed first attempt
             _node("online", 30, 480, 1.0, 0, epoch=2, partition=0),
             _node("online", 30, 480, 1.0, 0, epoch=2, partition=1)]
    view = ProgressTracker(0.0, epoch=2).update(1.0, nodes, {})
    seen = (view.epoch, view.steps, view.examples, view.workers_online, view.workers_seen)
    assert seen == (2, 60, 960, 2, 2)
    clock, stream = _Clock(), io.StringIO()
    left = [dict(n, state="left") for n in nodes]
    with LiveProgress(lambda: (left, {}), stream=stream, interval_s=3600, clock=clock, description="fit",
                      epoch=2):
        clock.now = 1.0
    closing = stream.getvalue().splitlines()[-1]
    assert closing.startswith("fit done: 2 workers | epoch 2 | 60 steps, 960 examples"), closing


def test_a_failed_job_closes_with_failed_and_its_reason() -> None:
    import pytest

    stream = io.StringIO()
    with pytest.raises(RuntimeError), LiveProgress(lambda: ([], {}), stream=stream, interval_s=3600,
                                                   description="fit"):
        raise RuntimeError("the module's forward raised\nmore lines")
    assert stream.getvalue().splitlines() == ["fit failed: RuntimeError: the module's forward raised"]
