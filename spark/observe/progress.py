"""Live progress of a gradient-sharing fit on the driver, from the heartbeats the controller receives.

Workers put a few training gauges (``report_progress``) into their node's counters; the node's
heartbeat carries them to the controller about once a second (no second channel). On the driver,
:class:`LiveProgress` polls the controller's latest per-node stats and shows workers online,
epoch, examples/s, loss (moving average), bytes/s on the mesh and updates applied to the master:
a tqdm bar on stderr when it is a terminal, else a plain line every ``log_every_s`` seconds, and
always one closing line. The derivation (:class:`ProgressTracker`) and the formatting
(:func:`format_progress`) are pure functions of the snapshots, so they are tested without timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from psrv.spark.errors import SparkConfigError

__all__ = ["LiveProgress", "ProgressTracker", "ProgressView", "check_progress", "epoch_line",
           "format_progress", "report_progress"]

GAUGE_PREFIX = "train_"
DEFAULT_LOG_EVERY_S = 10.0


def check_progress(value: Any) -> bool | float:
    """``progress=``: True (on; a plain line every 10 s off a terminal), False/None (off), or seconds
    between plain lines (on). Anything else is a clear error, on the driver."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int | float) and math.isfinite(value) and value > 0:
        return float(value)
    raise SparkConfigError(f"progress: expected True, False or seconds between progress lines (> 0), "
                           f"got {value!r}")
_LOSS_EMA = 0.1  # weight of the newest step in a worker's loss moving average


class LossAverage:
    """A worker's exponential moving average of the step loss (what the progress display shows)."""

    def __init__(self, weight: float = _LOSS_EMA) -> None:
        self.weight = weight
        self.value: float | None = None

    def add(self, loss: float) -> float | None:
        if math.isfinite(loss):
            self.value = loss if self.value is None else self.value + self.weight * (loss - self.value)
        return self.value


def report_progress(node: Any, *, partition: int, epoch: int, steps: int, examples: int,
                    loss: float | None) -> None:
    """On a worker: publish training gauges in the node's heartbeat stats (plain numbers only);
    ``epoch`` counts from 1, as the history and the checkpoint names do."""
    counters = node.counters_
    gauges = counters.gauges
    gauges["train_partition"] = int(partition)
    gauges["train_epoch"] = int(epoch)
    gauges["train_steps"] = int(steps)
    gauges["train_examples"] = int(examples)
    gauges["train_bytes_out"] = int(counters["bytes_out"])
    gauges["train_bytes_in"] = int(counters["bytes_in"])
    if loss is not None and math.isfinite(loss):
        gauges["train_loss"] = float(loss)


@dataclass(frozen=True)
class ProgressView:
    """What one progress line says."""

    workers_online: int
    workers_seen: int
    epoch: int | None
    steps: int
    examples: int
    examples_per_s: float | None
    loss: float | None
    mesh_bytes: int
    mesh_bytes_per_s: float | None
    updates_applied: int
    elapsed_s: float


def _num(stats: Mapping[str, Any], key: str) -> float | None:
    value = stats.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class ProgressTracker:
    """Derives a :class:`ProgressView` from successive snapshots (pure: the caller passes the time).

    ``nodes``: the controller's ``node_stats()`` (each ``{"state", "stats"}``); ``master``: the
    controller's counters (``updates_applied``, ``bytes_out``). ``epoch`` (1-based): the epoch this
    job trains; a controller kept for a whole fit still lists the departed nodes of earlier epochs,
    whose gauges are left out. Steps and examples count each partition once (its furthest attempt:
    a retried task's first attempt is not added to its retry). Rates are over the window since the
    previous snapshot; the loss is the examples-weighted mean of the workers' moving averages.
    """

    def __init__(self, start: float, epoch: int | None = None) -> None:
        self.start = start
        self.epoch = epoch
        self._last: tuple[float, int, int] | None = None  # time, examples, mesh bytes
        self._rates: tuple[float | None, float | None] = (None, None)

    def _this_epoch(self, nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The nodes of this job: those that reported this epoch, or nothing yet and are online."""
        kept = []
        for node in nodes:
            epoch = _num(node.get("stats") or {}, "train_epoch")
            if self.epoch is None or (epoch is None and node.get("state") == "online") \
                    or (epoch is not None and int(epoch) == self.epoch):
                kept.append(node)
        return kept

    def update(self, now: float, nodes: Sequence[Mapping[str, Any]],
               master: Mapping[str, Any]) -> ProgressView:
        nodes = self._this_epoch(nodes)
        online = 0
        epochs: list[int] = []
        mesh_bytes = 0
        loss_weighted = loss_weight = 0.0
        furthest: dict[Any, tuple[int, int]] = {}  # partition -> (steps, examples) of its furthest attempt
        for index, node in enumerate(nodes):
            stats = node.get("stats") or {}
            if node.get("state") == "online":
                online += 1
            node_examples = _num(stats, "train_examples") or 0.0
            partition = _num(stats, "train_partition")
            key = int(partition) if partition is not None else ("node", index)
            counted = (int(_num(stats, "train_steps") or 0), int(node_examples))
            furthest[key] = max(furthest.get(key, (0, 0)), counted)
            mesh_bytes += int(_num(stats, "train_bytes_out") or 0)
            epoch = _num(stats, "train_epoch")
            if epoch is not None:
                epochs.append(int(epoch))
            loss = _num(stats, "train_loss")
            if loss is not None:
                weight = max(node_examples, 1.0)
                loss_weighted += loss * weight
                loss_weight += weight
        steps = sum(s for s, _ in furthest.values())
        examples = sum(e for _, e in furthest.values())
        mesh_bytes += int(_num(master, "bytes_out") or 0)
        if self._last is not None and now > self._last[0]:
            window = now - self._last[0]
            self._rates = (max(0, examples - self._last[1]) / window,
                           max(0, mesh_bytes - self._last[2]) / window)
        self._last = (now, examples, mesh_bytes)
        epoch_shown = self.epoch if self.epoch is not None else (max(epochs) if epochs else None)
        return ProgressView(
            workers_online=online, workers_seen=len(furthest), epoch=epoch_shown,
            steps=steps, examples=examples, examples_per_s=self._rates[0],
            loss=loss_weighted / loss_weight if loss_weight else None, mesh_bytes=mesh_bytes,
            mesh_bytes_per_s=self._rates[1], updates_applied=int(_num(master, "updates_applied") or 0),
            elapsed_s=max(0.0, now - self.start),
        )

    def overall(self, view: ProgressView) -> ProgressView:
        """The view with rates over the whole fit (for the closing line)."""
        elapsed = view.elapsed_s
        if elapsed <= 0:
            return view
        return ProgressView(**{**view.__dict__, "examples_per_s": view.examples / elapsed,
                               "mesh_bytes_per_s": view.mesh_bytes / elapsed})


def _bytes(value: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000.0
    return f"{value:.1f} GB"


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count != 1 else ''}"


def format_progress(view: ProgressView, final: bool = False) -> str:
    """One line: ``2 workers online | epoch 1 | 1,234 ex/s | loss 0.4123 | mesh 1.2 MB/s | ...``; the
    closing line (``final``) names the workers that trained this epoch (all have left by then)."""
    if final:
        parts = [_workers(view.workers_seen)]
    else:
        parts = [f"{_workers(view.workers_online)} online"
                 + (f" ({view.workers_seen} seen)" if view.workers_seen > view.workers_online else "")]
    parts.append(f"epoch {view.epoch}" if view.epoch is not None else "epoch -")
    parts.append(f"{view.steps:,} steps, {view.examples:,} examples")
    parts.append(f"{view.examples_per_s:,.0f} ex/s" if view.examples_per_s is not None else "- ex/s")
    parts.append(f"loss {view.loss:.4f}" if view.loss is not None else "loss -")
    parts.append(f"mesh {_bytes(view.mesh_bytes_per_s)}/s" if view.mesh_bytes_per_s is not None else "mesh -")
    parts.append(f"master applied {view.updates_applied:,} updates")
    parts.append(f"{view.elapsed_s:.0f} s")
    return " | ".join(parts)


class LiveProgress:
    """A driver thread showing a fit's progress; a context manager around the Spark job.

    ``source()`` returns ``(nodes, master_counters)``; for a controller use :meth:`for_controller`.
    ``enabled`` False makes it a no-op.
    """

    def __init__(self, source: Callable[[], tuple[Sequence[Mapping[str, Any]], Mapping[str, Any]]], *,
                 enabled: bool = True, stream: TextIO | None = None, interval_s: float = 1.0,
                 log_every_s: float = 10.0, description: str = "psrv fit",
                 clock: Callable[[], float] = time.monotonic, epoch: int | None = None) -> None:
        self.source = source
        self.enabled = bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.log_every_s = log_every_s
        self.description = description
        self.clock = clock
        self.tracker = ProgressTracker(clock(), epoch)
        self.last_view: ProgressView | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._last_line = -math.inf
        self._final: tuple[int, int, int] | None = None

    @classmethod
    def for_controller(cls, controller: Any, setting: Any = True, **kwargs: Any) -> LiveProgress:
        """Progress of the fit whose controller this is; ``setting`` as :func:`check_progress` takes;
        ``epoch=`` (1-based) the epoch the job trains."""
        def source() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            return controller.node_stats(), controller.counters_.snapshot()

        setting = check_progress(setting)
        kwargs.setdefault("log_every_s", DEFAULT_LOG_EVERY_S if setting is True else float(setting or 1.0))
        return cls(source, enabled=bool(setting), **kwargs)

    def _tty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        try:
            return bool(isatty()) if callable(isatty) else False
        except (OSError, ValueError):
            return False

    def poll(self) -> ProgressView | None:
        """Take one snapshot and show it (the thread calls this; tests may call it directly)."""
        try:
            nodes, master = self.source()
        except Exception:  # the controller stopping, or busy beyond the call's deadline: skip a beat
            return self.last_view
        view = self.tracker.update(self.clock(), nodes, master)
        self.last_view = view
        line = format_progress(view)
        if self._bar is not None:
            self._bar.set_postfix_str(line, refresh=False)
            self._bar.n = view.examples
            self._bar.refresh()
        elif self.clock() - self._last_line >= self.log_every_s:
            self._last_line = self.clock()
            self._write(f"{self.description}: {line}")
        return view

    def finish_with(self, steps: int, examples: int, workers: int | None = None) -> None:
        """The job's own totals (its tasks' results) for the closing line: a short epoch can end before
        any worker's heartbeat carried its counts to the controller, which would read "0 steps", and
        the results are exact where the beats lag behind."""
        self._final = (int(steps), int(examples), -1 if workers is None else int(workers))

    def _write(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(line + "\n")
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def __enter__(self) -> LiveProgress:
        if not self.enabled:
            return self
        if self._tty():
            from tqdm import tqdm

            self._bar = tqdm(total=None, desc=self.description, unit="ex", file=self.stream, leave=False,
                             dynamic_ncols=True, bar_format="{desc}{postfix}")
        self._last_line = self.clock()  # the first plain line after log_every_s
        self._thread = threading.Thread(target=self._loop, name="psrv-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 5.0)
        view = self.poll() if exc[0] is None else self.last_view
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if exc[0] is not None:
            reason = (str(exc[1]).strip().splitlines() or [""])[0][:300]
            self._write(f"{self.description} failed: {exc[0].__name__}: {reason}")
            return
        if view is None:  # the controller never answered
            if self._final is None:
                return
            view = self.tracker.update(self.clock(), [], {})
        if self._final is not None:
            steps, examples, workers = self._final
            view = dataclasses.replace(view, steps=steps, examples=examples,
                                       workers_seen=workers if workers >= 0 else view.workers_seen)
        self._write(f"{self.description} done: {format_progress(self.tracker.overall(view), final=True)}")


def epoch_line(master: Any, epoch: int, epochs: int, metrics: Mapping[str, float]) -> None:
    """With the master's ``progress`` on: one line on stderr after each epoch of a multi-epoch fit,
    ``psrv: epoch 2/5 | loss 0.31 | val_loss 0.35 | val_accuracy 0.91`` (1-based, as everywhere)."""
    if not getattr(master, "progress", False):
        return
    parts = [f"{name} {value:.4g}" for name, value in metrics.items()]
    print(f"psrv: epoch {epoch}/{epochs} | " + " | ".join(parts), file=sys.stderr, flush=True)
