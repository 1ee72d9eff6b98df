"""The training timeline as Chrome Trace Event JSON, for Perfetto (ui.perfetto.dev) and chrome://tracing.

One process per worker (named host:pid, with "offset ±error" when its times were moved onto the
driver's clock; the driver last), one complete event ("X") per timed
record with its fields as ``args``, counters ("C") for the per-step metrics, and a global instant
event ("i") at each epoch's start. Timestamps are microseconds since the earliest record.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from psrv.spark import storage
from psrv.spark.observe.report import epoch_starts, kind_label
from psrv.spark.observe.stats import METRIC_FIELDS, VALIDATION_KIND, clock_notes, normalize_stats

__all__ = ["chrome_trace", "export_chrome_trace"]


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def chrome_trace(stats: Iterable[Mapping[str, Any]] | Mapping[str, Any]) -> dict[str, Any]:
    """The trace as a dict (``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``)."""
    records = normalize_stats(stats)
    workers = sorted({r["worker"] for r in records}, key=lambda w: (w == "driver", w))
    pid = {worker: index + 1 for index, worker in enumerate(workers)}
    times = [r.get("start", r.get("time")) for r in records]
    origin = min(times) if times else 0.0

    def us(seconds: float) -> float:
        return round((seconds - origin) * 1e6, 3)

    clocks = clock_notes(records)  # "offset ±error" of workers moved onto the driver's clock
    trace: list[dict[str, Any]] = []
    for worker in workers:
        name = f"{worker} ({clocks[worker]})" if worker in clocks else worker
        trace.append({"ph": "M", "name": "process_name", "pid": pid[worker], "tid": 0,
                      "args": {"name": name}})
        trace.append({"ph": "M", "name": "process_sort_index", "pid": pid[worker], "tid": 0,
                      "args": {"sort_index": pid[worker]}})
    for record in records:
        args = {k: _plain(v) for k, v in record.items()
                if k not in ("worker", "kind", "start", "end", "time")}
        if "start" in record:
            trace.append({"ph": "X", "name": kind_label(record["kind"]), "cat": record["kind"],
                          "pid": pid[record["worker"]], "tid": 0, "ts": us(record["start"]),
                          "dur": round((record["end"] - record["start"]) * 1e6, 3), "args": args})
        at = record.get("end", record.get("time"))
        prefix = "validation " if record["kind"] == VALIDATION_KIND else ""
        fields = METRIC_FIELDS if not prefix else [k for k, v in record.items() if k not in (
            "worker", "kind", "time", "iteration", "epoch", "partition") and isinstance(v, int | float)]
        for metric in fields:
            value = record.get(metric)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                trace.append({"ph": "C", "name": f"{prefix}{metric}", "pid": pid[record["worker"]], "tid": 0,
                              "ts": us(at), "args": {metric: float(value)}})
    for epoch, start in epoch_starts([r for r in records if "start" in r]).items():
        trace.append({"ph": "i", "s": "g", "name": f"epoch {epoch}", "pid": 0, "tid": 0, "ts": us(start)})
    return {"traceEvents": trace, "displayTimeUnit": "ms",
            "otherData": {"producer": "psrv", "origin_unix_s": origin}}


def export_chrome_trace(stats: Iterable[Mapping[str, Any]] | Mapping[str, Any], path: str) -> str:
    """Write the trace to ``path`` (a local file, atomically) and return the path; open it in
    Perfetto or chrome://tracing."""
    text = json.dumps(chrome_trace(stats), allow_nan=False)
    target = os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)
    storage.write_bytes(target, text.encode("utf-8"))
    return target
