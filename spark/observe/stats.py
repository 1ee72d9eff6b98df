"""The training-statistics record format: plain data that workers produce and the report reads.

``stats`` is a list of dicts (JSON- and pickle-friendly; a dict ``{"version": 1, "events": [...]}``
is accepted too). Each dict is either a timed **event** or a **point sample**.

Event (something a worker spent time on)::

    {"worker": "host:1234",      # required, str: one timeline row per distinct value ("driver" too)
     "kind": "fit",              # required, str: see EVENT_KINDS (other kinds are shown in grey)
     "start": 1700000000.12,     # required, float: seconds since the Unix epoch, time.time() of
     "end": 1700000000.19,       #   that worker's machine, moved onto the driver's clock when its
                                 #   offset is known (see on_driver_clock)
     # optional, any of:
     "partition": 3, "round": 0, "iteration": 17, "epoch": 1, "examples": 32,
     "loss": 0.41, "threshold": 1e-3, "sparsity": 2.5e-3, "bytes": 4096}

Point sample (a metric without a duration)::

    {"worker": "host:1234", "kind": "metrics", "time": 1700000000.2, "iteration": 17,
     "threshold": 1e-3, "sparsity": 2.5e-3, "bytes": 4096}

Metric fields (``METRIC_FIELDS``) may appear on any record; the report draws one line per worker
for each, against ``iteration`` when the record has one, else the worker's step count so far.
``sparsity`` is the fraction of parameters a message carried (elements sent / parameters: a
sparse message's count is in its header, a bitmap's is counted); ``elements`` that count;
``bytes`` the encoded message size.

Validation sample (what the model scored on held-out data, drawn as its own chart)::

    {"worker": "driver", "kind": "validation", "time": 1700000001.0, "iteration": 120, "epoch": 1,
     "accuracy": 0.93, "f1": 0.92}

Clock offset (gradient sharing: each worker's offset from the driver's clock, estimated from the
heartbeat round trips, psrv.server.clock_offset): ``"clock_offset_s"`` (already added to the
worker's times) and ``"clock_error_s"`` (the bound on its error) on each record of that worker.
``epoch`` counts from 1 everywhere (events, validation samples, the metrics sinks, the progress line,
the history and the checkpoint names): the epoch a record belongs to, the first being epoch 1.

Kinds and their meaning:

- ``catch_up``  a joining worker downloading parameters (and skipping what they already hold)
- ``setup``     task start-up before training (deserializing the network, starting the node)
- ``fit``       computing one minibatch's update (forward, backward, updater)
- ``wait``      waiting for the next minibatch from the data source
- ``encode``    threshold-encoding the residual into a message
- ``apply``     applying received updates
- ``averaging`` one parameter-averaging round (driver) or its aggregation
- ``flush``     a worker waiting until the controller acknowledged its updates, before leaving
- ``replica_check``  a worker checking its final replica against the master copy (status: equal, differs…)
- ``residual_carried``  a worker starting from the residual its previous task left
- ``export``    the driver exporting the data as minibatch files
- ``training_job``  the driver's whole Spark job of one fit
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from psrv.spark.errors import SparkInputError

__all__ = [
    "EVENT_KINDS",
    "METRIC_FIELDS",
    "VALIDATION_KIND",
    "STATS_VERSION",
    "StatsFormatError",
    "event",
    "metrics_sample",
    "normalize_stats",
    "on_driver_clock",
    "clock_notes",
    "validation_sample",
]

STATS_VERSION = 1
EVENT_KINDS: dict[str, str] = {
    "catch_up": "catch-up (download parameters)",
    "setup": "task setup",
    "fit": "fit step",
    "wait": "waiting for data",
    "encode": "encoding",
    "apply": "applying updates",
    "averaging": "parameter averaging round",
    "flush": "flush (until updates acknowledged)",
    "replica_check": "replica check (against the master)",
    "residual_carried": "residual carried over",
    "export": "export minibatches",
    "training_job": "training job (driver)",
}
VALIDATION_KIND = "validation"
# Other spellings producers may use, mapped to the kinds above.
KIND_ALIASES: dict[str, str] = {
    "catchup": "catch_up",
    "catch-up": "catch_up",
    "wait_data": "wait",
    "waiting": "wait",
    "encoding": "encode",
    "average": "averaging",
}
METRIC_FIELDS: tuple[str, ...] = ("loss", "threshold", "sparsity", "bytes")


class StatsFormatError(SparkInputError):
    """A training-stats record does not follow the format documented in psrv.spark.observe.stats."""


def event(worker: str, kind: str, start: float, end: float, **fields: Any) -> dict[str, Any]:
    """One timed event record (a convenience; a plain dict literal is just as good)."""
    return {"worker": str(worker), "kind": kind, "start": float(start), "end": float(end), **fields}


def metrics_sample(worker: str, time: float, **metrics: Any) -> dict[str, Any]:
    """One point sample of metrics (threshold, sparsity, bytes ...) at wall-clock ``time``."""
    return {"worker": str(worker), "kind": "metrics", "time": float(time), **metrics}


def validation_sample(time: float, iteration: int, epoch: int, worker: str = "driver",
                      **metrics: Any) -> dict[str, Any]:
    """One validation record (accuracy, f1, loss ... on held-out data) at wall-clock ``time``."""
    return {"worker": str(worker), "kind": VALIDATION_KIND, "time": float(time), "iteration": int(iteration),
            "epoch": int(epoch), **metrics}


def _number(record: Mapping[str, Any], key: str, index: int) -> float:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StatsFormatError(f"stats record {index}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def normalize_stats(stats: Iterable[Mapping[str, Any]] | Mapping[str, Any]) -> list[dict[str, Any]]:
    """Validated copies of the records, kinds canonical, sorted by time; raises StatsFormatError.

    Metric fields that are not finite numbers (None, NaN) are dropped from the copy rather than
    failing the whole report.
    """
    if isinstance(stats, Mapping):
        version = stats.get("version", STATS_VERSION)
        if version != STATS_VERSION:
            raise StatsFormatError(f"stats: unsupported version {version!r}; expected {STATS_VERSION}")
        stats = stats.get("events", [])
    out: list[dict[str, Any]] = []
    for index, record in enumerate(stats):
        if not isinstance(record, Mapping):
            raise StatsFormatError(f"stats record {index}: expected a dict, got {type(record).__name__}")
        for key in ("worker", "kind"):
            if key not in record:
                raise StatsFormatError(f"stats record {index}: missing {key!r} (have {sorted(record)})")
        copy = dict(record)
        copy["worker"] = str(record["worker"])
        kind = str(record["kind"])
        copy["kind"] = KIND_ALIASES.get(kind, kind)
        if "start" in record or "end" in record:
            if "start" not in record or "end" not in record:
                raise StatsFormatError(f"stats record {index}: an event needs both 'start' and 'end'")
            copy["start"], copy["end"] = _number(record, "start", index), _number(record, "end", index)
            if copy["end"] < copy["start"]:
                raise StatsFormatError(
                    f"stats record {index}: 'end' ({copy['end']}) is before 'start' ({copy['start']})"
                )
        elif "time" in record:
            copy["time"] = _number(record, "time", index)
        else:
            raise StatsFormatError(f"stats record {index}: expected 'start'/'end' (event) or 'time' (sample)")
        for key in METRIC_FIELDS:
            if key in copy:
                value = copy[key]
                ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
                if not ok:
                    del copy[key]
        out.append(copy)
    out.sort(key=lambda r: (r.get("start", r.get("time", 0.0)), r["worker"]))
    return out


CLOCK_FIELDS = ("clock_offset_s", "clock_error_s")


def on_driver_clock(records: Iterable[Mapping[str, Any]], offset_s: Any,
                    error_s: Any) -> list[dict[str, Any]]:
    """A worker's records moved onto the driver's clock: ``offset_s`` (driver minus worker, seconds)
    added to their times, the offset and its error bound noted on each. Without a finite estimate
    (the worker's node saw no round trip) the records are returned as they are."""
    plain = [dict(r) for r in records]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               for v in (offset_s, error_s)):
        return plain
    for record in plain:
        for key in ("start", "end", "time"):
            if isinstance(record.get(key), int | float):
                record[key] = float(record[key]) + float(offset_s)
        record["clock_offset_s"], record["clock_error_s"] = float(offset_s), float(error_s)
    return plain


def clock_notes(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Per worker whose times were moved onto the driver's clock: ``"offset +1.25 ms ±0.40 ms"``."""
    notes: dict[str, str] = {}
    for record in records:
        offset, error = (record.get(k) for k in CLOCK_FIELDS)
        if isinstance(offset, int | float) and isinstance(error, int | float):
            notes[str(record["worker"])] = f"offset {offset * 1e3:+.2f} ms ±{error * 1e3:.2f} ms"
    return notes
