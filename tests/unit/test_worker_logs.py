"""Worker logs on the driver: capture in a task (rate-limited, bounded) and relay naming the worker."""

from __future__ import annotations

import logging

from psrv.spark.observe.worker_logs import DRIVER_LOGGER, WorkerLogCapture, relay_worker_logs


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_capture_keeps_warnings_rate_limited_and_bounded() -> None:
    clock = _Clock()
    capture = WorkerLogCapture(worker="h:1", partition=3, attempt=1, clock=clock, max_records=5)
    logger = logging.getLogger("psrv.test.worker")
    with capture:
        logger.info("not kept: below WARNING")
        for _ in range(10):
            logger.warning("peer %d is slow", 7)  # one kept, nine suppressed within the interval
        clock.now = 2.0
        logger.warning("peer %d is slow", 7)
        logger.error("boom")
        for i in range(10):
            logger.warning("distinct %d", i) if i == 0 else logger.warning(f"distinct-{i}")
    logger.warning("after detaching: not kept")
    records = capture.summary()
    messages = [r["message"] for r in records]
    assert messages[0] == "peer 7 is slow"
    assert messages[1] == "peer 7 is slow (9 more like this suppressed)"
    assert messages[2] == "boom" and records[2]["level"] == logging.ERROR
    assert len(capture.records) == 5 and capture.dropped == 8
    assert "8 over-limit" in messages[-1]
    assert all(r["worker"] == "h:1" and r["partition"] == 3 and r["attempt"] == 1 for r in records)


def test_debug_stats_keep_first_periodic_and_last() -> None:
    clock = _Clock()
    capture = WorkerLogCapture(worker="h:1", partition=0, clock=clock, interval_s=1.0)
    for step in range(1, 31):
        clock.now = step * 0.25
        capture.debug_stats(step, f"tau=0.1 count={step}")
    records = capture.detach()
    steps = [int(r["message"].split()[2].rstrip(":")) for r in records if "encoding step" in r["message"]]
    assert steps[0] == 1 and steps[-1] == 30
    assert len(steps) < 30 and steps == sorted(steps)
    assert all(r["level"] == logging.INFO for r in records if "encoding step" in r["message"])


def test_attach_replaces_a_capture_a_failed_task_left_behind() -> None:
    stale = WorkerLogCapture(worker="h:1", partition=0).attach()
    fresh = WorkerLogCapture(worker="h:1", partition=1).attach()
    try:
        handlers = [h for h in logging.getLogger().handlers if isinstance(h, WorkerLogCapture)]
        assert handlers == [fresh]
    finally:
        fresh.detach()
        stale.detach()


def test_relay_names_worker_and_partition_and_obeys_the_driver_level(caplog) -> None:
    common = {"worker": "h:9", "partition": 2}
    records = [{**common, "attempt": 0, "level": logging.INFO, "logger": "psrv.encoding.debug",
                "message": "encoding step 4: tau=0.1"},
               {**common, "attempt": 1, "level": logging.WARNING, "logger": "psrv.transport",
                "message": "peer slow"}]
    caplog.set_level(logging.WARNING, logger=DRIVER_LOGGER)
    assert relay_worker_logs(records) == 1  # the driver's level hides INFO
    assert caplog.records[-1].getMessage() == "worker h:9 partition 2 attempt 1 (psrv.transport): peer slow"
    caplog.set_level(logging.INFO, logger=DRIVER_LOGGER)
    assert relay_worker_logs(records) == 2
    assert "worker h:9 partition 2 (psrv.encoding.debug): encoding step 4" in caplog.records[-2].getMessage()
    assert relay_worker_logs(records * 3, max_records=2) == 2
    assert "4 more worker log records not shown" in caplog.records[-1].getMessage()
