"""Worker logs on the driver: what a Spark task logged, carried back in its result and re-logged.

An executor's Python worker has no logging handlers, so a warning there goes nowhere a user looks.
Inside a task, :class:`WorkerLogCapture` keeps the task's WARNING-and-above records (any logger,
the node's I/O thread included) and the ``encoding_debug_mode`` statistics, rate-limited and
bounded; the task returns them with its result and :func:`relay_worker_logs` logs them on the
driver through the ``psrv.spark.observe.worker_logs`` logger, each line naming the worker (host:pid) and
partition. The driver's logging configuration decides what is shown: the debug statistics are
INFO, warnings stay warnings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["DRIVER_LOGGER", "WorkerLogCapture", "relay_worker_logs"]

DRIVER_LOGGER = "psrv.spark.observe.worker_logs"
MAX_RECORDS = 200  # per task: what one result may carry
INTERVAL_S = 1.0  # per kind of message: at most one record per interval (the rest are counted)
_MESSAGE_CHARS = 2000


class WorkerLogCapture(logging.Handler):
    """Collects a task's log records (>= ``level``) and debug statistics; a context manager that
    attaches itself to the root logger for the task's duration."""

    def __init__(self, *, worker: str, partition: int, attempt: int = 0, level: int = logging.WARNING,
                 max_records: int = MAX_RECORDS, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(level)
        self.common = {"worker": worker, "partition": int(partition), "attempt": int(attempt)}
        self.max_records = max_records
        self.interval_s = interval_s
        self.clock = clock
        self.records: list[dict[str, Any]] = []
        self.dropped = 0
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()
        self._last_debug: tuple[int, str] | None = None
        self._debug_kept_last = True
        self._guard = threading.Lock()

    # -- collecting ---------------------------------------------------------------------------------
    def _admit(self, key: str) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] += 1
            return False
        self._last[key] = now
        return True

    def _append(self, level: int, name: str, message: str, key: str) -> None:
        if len(self.records) >= self.max_records:
            self.dropped += 1
            return
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            message += f" ({suppressed} more like this suppressed)"
        self.records.append({**self.common, "level": int(level), "logger": name,
                             "message": message[:_MESSAGE_CHARS], "time": time.time()})

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(DRIVER_LOGGER):
            return
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        except Exception:  # a record whose arguments do not format: keep the template
            message = str(record.msg)
        key = f"{record.name}:{record.levelno}:{record.msg}"[:300]
        with self._guard:
            if self._admit(key):
                self._append(record.levelno, record.name, message, key)

    def debug_stats(self, step: int, stats: Any) -> None:
        """One step's encoding statistics (``encoding_debug_mode``): the first, then at most one per
        interval, and the last step's always (added by :meth:`close`)."""
        text = f"encoding step {step}: {stats}"
        with self._guard:
            if self._admit("encoding_debug"):
                self._append(logging.INFO, "psrv.encoding.debug", text, "encoding_debug")
                self._debug_kept_last = True
            else:
                self._debug_kept_last = False
            self._last_debug = (step, text)

    def summary(self) -> list[dict[str, Any]]:
        """The records, with the last debug step and what was suppressed or dropped accounted for."""
        with self._guard:
            if self._last_debug is not None and not self._debug_kept_last:
                self._suppressed["encoding_debug"] -= 1
                self._append(logging.INFO, "psrv.encoding.debug", self._last_debug[1], "encoding_debug")
                self._debug_kept_last = True
            leftover = sum(n for n in self._suppressed.values() if n > 0)
            out = list(self.records)
            if leftover or self.dropped:
                note = (f"{leftover} rate-limited and {self.dropped} over-limit log records of this task "
                        "were not carried to the driver")
                out.append({**self.common, "level": logging.INFO, "logger": DRIVER_LOGGER,
                            "time": time.time(), "message": note})
        return out

    # -- attaching ----------------------------------------------------------------------------------
    def attach(self) -> WorkerLogCapture:
        """Attach to the root logger, first removing a capture a failed earlier task of this Python
        worker left behind (so a reused worker never accumulates handlers)."""
        root = logging.getLogger()
        for handler in list(root.handlers):
            if isinstance(handler, WorkerLogCapture):
                root.removeHandler(handler)
        root.addHandler(self)
        return self

    def detach(self) -> list[dict[str, Any]]:
        """Detach and return :meth:`summary`."""
        logging.getLogger().removeHandler(self)
        return self.summary()

    def __enter__(self) -> WorkerLogCapture:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger().removeHandler(self)


def relay_worker_logs(records: Iterable[Mapping[str, Any]], logger: logging.Logger | None = None,
                      max_records: int = 1000) -> int:
    """Log the workers' records on the driver (``psrv.spark.observe.worker_logs`` by default), each naming
    its worker and partition; returns how many were logged (at most ``max_records`` per call)."""
    logger = logger or logging.getLogger(DRIVER_LOGGER)
    logged = skipped = 0
    for record in records:
        level = int(record.get("level", logging.INFO))
        if not logger.isEnabledFor(level):
            continue
        if logged >= max_records:
            skipped += 1
            continue
        attempt = int(record.get("attempt", 0))
        logger.log(level, "worker %s partition %s%s (%s): %s", record.get("worker", "?"),
                   record.get("partition", "?"), f" attempt {attempt}" if attempt else "",
                   record.get("logger", "?"), record.get("message", ""))
        logged += 1
    if skipped:
        logger.warning("%d more worker log records not shown (limit %d per fit)", skipped, max_records)
    return logged
