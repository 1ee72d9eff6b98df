"""The training-statistics report: one self-contained HTML file (inline SVG, no network access).

``export_stats_html(stats, path)`` takes the records described in :mod:`psrv.spark.observe.stats` and
writes a timeline with one row per worker (each activity a coloured bar, hover for details) and
one line chart per metric (loss, threshold, sparsity, bytes per step; one line per worker).
"""

from __future__ import annotations

import html
import json
import math
import time
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psrv.spark import storage
from psrv.spark.observe.stats import EVENT_KINDS, METRIC_FIELDS, VALIDATION_KIND, clock_notes, normalize_stats

__all__ = ["CLOCK_ALIGNED", "CLOCK_CAVEAT", "epoch_starts", "export_stats_html", "kind_colour", "kind_label",
           "render_stats_html", "worker_summary"]

CLOCK_CAVEAT = (
    "Timestamps are taken from the wall clock (time.time()) of the machine each worker ran on. "
    "Clocks of different machines may disagree by milliseconds to seconds, so the alignment of "
    "events across rows is approximate; within one row, order and durations are exact."
)
CLOCK_ALIGNED = (
    "Each worker's times were moved onto the driver's clock by its offset estimated from the "
    "heartbeat round trips; the alignment across rows is good to the error shown per worker "
    "(clock column: offset ±error)."
)

_KIND_COLOURS = {
    "catch_up": "#8e44ad",
    "setup": "#95a5a6",
    "fit": "#1f6fd1",
    "wait": "#f39c12",
    "encode": "#27ae60",
    "apply": "#16a085",
    "averaging": "#c0392b",
    "flush": "#e84393",
    "replica_check": "#2d3436",
    "residual_carried": "#6c5ce7",
    "export": "#a0522d",
    "training_job": "#d5dbdf",
}
# kinds no producer of psrv emits get one of these, by name (stable across reports)
_EXTRA_COLOURS = ["#00b894", "#fd79a8", "#e17055", "#0984e3", "#b8860b", "#2d3436", "#74b9ff", "#55efc4"]
# drawing order inside a row: long background activities first, the short fit steps last (on top)
_LAYER = {"training_job": 0, "export": 0, "setup": 1, "catch_up": 1, "flush": 1, "replica_check": 1,
          "residual_carried": 1,
          "averaging": 1, "wait": 2, "apply": 3, "encode": 3, "fit": 4}
_THIN_KINDS = {"wait", "training_job", "export"}  # drawn half height so the steps stand out
_LINE_COLOURS = ["#2e86de", "#e74c3c", "#27ae60", "#8e44ad", "#f39c12", "#16a085", "#d35400", "#2c3e50"]
_METRIC_TITLES = {
    "loss": "Training loss per step (line: moving average; faint points: each step)",
    "threshold": "Encoding threshold per step",
    "sparsity": "Sparsity per step (elements sent / parameters)",
    "bytes": "Bytes per step (encoded message size)",
    "validation": "Validation metrics (held-out data)",
}
_MAX_POINTS_PER_LINE = 2000
_ROW_HEIGHT = 22
_TOP = 16  # room for the epoch labels above the timeline rows
_LABEL_WIDTH = 170
_PLOT_WIDTH = 900

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 24px; color: #2d3436; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; } h3 { font-size: 14px; margin: 18px 0 4px; }
.caveat { background: #fff8e1; border-left: 4px solid #f39c12; padding: 8px 12px; max-width: 1060px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { padding: 3px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.legend span { display: inline-block; margin-right: 14px; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
svg text { font-size: 11px; fill: #2d3436; }
svg .event:hover { stroke: #2d3436; stroke-width: 1; }
svg .epoch-mark { stroke: #636e72; stroke-dasharray: 4 3; }
svg text.epoch-label { fill: #636e72; font-size: 10px; }
.empty { color: #636e72; font-style: italic; }
"""


def kind_colour(kind: str) -> str:
    """The timeline colour of an event kind: psrv's kinds fixed, any other one stable by its name."""
    if kind in _KIND_COLOURS:
        return _KIND_COLOURS[kind]
    return _EXTRA_COLOURS[zlib.crc32(kind.encode("utf-8")) % len(_EXTRA_COLOURS)]


def kind_label(kind: str) -> str:
    """A readable name for an event kind."""
    return EVENT_KINDS.get(kind, kind.replace("_", " "))


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _utc(seconds: float) -> str:
    whole = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{int(round((seconds % 1) * 1000)) % 1000:03d} UTC"


def _nice_ticks(low: float, high: float, count: int = 6) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        return [low]
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def _legend(kinds: Iterable[str]) -> str:
    items = []
    for kind in kinds:
        items.append(f'<span data-kind="{_esc(kind)}"><i style="background:{kind_colour(kind)}"></i>'
                     f"{_esc(kind_label(kind))}</span>")
    return '<div class="legend">' + "".join(items) + "</div>"


def _event_tooltip(record: Mapping[str, Any], origin: float) -> str:
    duration_ms = (record["end"] - record["start"]) * 1000.0
    lines = [
        f"{record['worker']}: {kind_label(record['kind'])}",
        f"start {_utc(record['start'])} (+{record['start'] - origin:.3f} s)",
        f"duration {duration_ms:.1f} ms",
    ]
    for key, value in record.items():
        if key not in ("worker", "kind", "start", "end"):
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def epoch_starts(events: Sequence[Mapping[str, Any]], key: str = "start") -> dict[int, float]:
    """Per epoch, the earliest ``key`` (wall-clock start, or iteration) of the records carrying it."""
    starts: dict[int, float] = {}
    for record in events:
        epoch, value = record.get("epoch"), record.get(key)
        if _is_number(epoch) and _is_number(value):
            e = int(epoch)
            starts[e] = min(starts.get(e, math.inf), float(value))
    return dict(sorted(starts.items()))


def _timeline(events: list[dict[str, Any]], workers: list[str]) -> str:
    if not events:
        return '<p class="empty">No timed events were recorded.</p>'
    origin = min(e["start"] for e in events)
    span = max(max(e["end"] for e in events) - origin, 1e-6)
    rows_bottom = _TOP + _ROW_HEIGHT * len(workers)
    height = rows_bottom + 30
    width = _LABEL_WIDTH + _PLOT_WIDTH + 20
    scale = _PLOT_WIDTH / span
    parts = [f'<svg class="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in events:
        by_worker[record["worker"]].append(record)
    for row, worker in enumerate(workers):
        y = _TOP + row * _ROW_HEIGHT
        parts.append(f'<g class="timeline-row" data-worker="{_esc(worker)}">')
        shade = "#f7f9fa" if row % 2 == 0 else "#ffffff"
        parts.append(f'<rect x="0" y="{y}" width="{width}" height="{_ROW_HEIGHT}" fill="{shade}"/>')
        label = worker if len(worker) <= 26 else worker[:12] + "…" + worker[-12:]
        parts.append(f'<text x="4" y="{y + 15}"><title>{_esc(worker)}</title>{_esc(label)}</text>')
        ordered = sorted(by_worker[worker], key=lambda r: _LAYER.get(r["kind"], 2))
        for record in ordered:
            x = _LABEL_WIDTH + (record["start"] - origin) * scale
            w = max((record["end"] - record["start"]) * scale, 1.0)
            inset = 7 if record["kind"] in _THIN_KINDS else 3
            parts.append(
                f'<rect class="event" data-kind="{_esc(record["kind"])}" x="{x:.2f}" y="{y + inset}" '
                f'width="{w:.2f}" height="{_ROW_HEIGHT - 2 * inset}" fill="{kind_colour(record["kind"])}">'
                f"<title>{_esc(_event_tooltip(record, origin))}</title></rect>"
            )
        parts.append("</g>")
    starts = epoch_starts(events)
    if len(starts) > 1 or (starts and next(iter(starts.values())) > origin + span * 0.01):
        for epoch, start in starts.items():
            x = _LABEL_WIDTH + (start - origin) * scale
            parts.append(f'<line class="epoch-mark" data-epoch="{epoch}" x1="{x:.2f}" y1="{_TOP - 2}" '
                         f'x2="{x:.2f}" y2="{rows_bottom}"/>')
            parts.append(f'<text class="epoch-label" x="{x + 2:.2f}" y="{_TOP - 4}">epoch {epoch}</text>')
    axis_y = rows_bottom + 4
    parts.append(
        f'<line x1="{_LABEL_WIDTH}" y1="{axis_y}" x2="{_LABEL_WIDTH + _PLOT_WIDTH}" y2="{axis_y}" '
        'stroke="#636e72"/>'
    )
    for tick in _nice_ticks(0.0, span):
        x = _LABEL_WIDTH + tick * scale
        parts.append(f'<line x1="{x:.2f}" y1="{axis_y}" x2="{x:.2f}" y2="{axis_y + 4}" stroke="#636e72"/>')
        parts.append(f'<text x="{x:.2f}" y="{axis_y + 16}" text-anchor="middle">{_fmt(tick)} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def _metric_series(records: list[dict[str, Any]], metric: str) -> dict[str, list[tuple[float, float]]]:
    """Per worker: (step, value) points; step = the record's iteration, else its position so far."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    steps: dict[str, int] = defaultdict(int)
    for record in records:
        if metric not in record or record["kind"] == VALIDATION_KIND:
            continue
        worker = record["worker"]
        iteration = record.get("iteration")
        x = float(iteration) if _is_number(iteration) else float(steps[worker])
        steps[worker] += 1
        series[worker].append((x, float(record[metric])))
    return series


def _validation_series(records: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per validation metric (accuracy, f1 ...): (step, value) points, in the order they came."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    skip = {"worker", "kind", "time", "start", "end", "iteration", "epoch", "partition"}
    for position, record in enumerate(r for r in records if r["kind"] == VALIDATION_KIND):
        x = float(record["iteration"]) if _is_number(record.get("iteration")) else float(position)
        for key, value in record.items():
            if key not in skip and _is_number(value):
                series[key].append((x, float(value)))
    return series


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (fewer at the start)."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def _chart(metric: str, series: Mapping[str, Sequence[tuple[float, float]]], names: list[str],
           epoch_marks: Mapping[int, float] | None = None) -> str:
    width, height, left, bottom, top = _LABEL_WIDTH + _PLOT_WIDTH + 20, 260, 70, 30, 14
    plot_w, plot_h = width - left - 20, height - bottom - top
    xs = [x for points in series.values() for x, _ in points]
    ys = [y for points in series.values() for _, y in points]
    x_low, x_high = min(xs), max(xs)
    positive = all(y > 0 for y in ys)
    log = positive and metric in ("threshold", "sparsity", "bytes") and max(ys) / min(ys) > 100
    transform = (lambda v: math.log10(v)) if log else (lambda v: v)
    y_low, y_high = transform(min(ys)), transform(max(ys))
    if y_high == y_low:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    if x_high == x_low:
        x_low, x_high = x_low - 0.5, x_high + 0.5

    def px(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (transform(y) - y_low) / (y_high - y_low) * plot_h

    parts = [
        f'<svg class="chart" data-metric="{metric}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fbfcfc" stroke="#dfe6e9"/>',
    ]
    for tick in _nice_ticks(y_low, y_high, 5):
        y = top + plot_h - (tick - y_low) / (y_high - y_low) * plot_h
        label = _fmt(10**tick) if log else _fmt(tick)
        parts.append(f'<line x1="{left}" y1="{y:.2f}" x2="{left + plot_w}" y2="{y:.2f}" stroke="#ecf0f1"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.2f}" text-anchor="end">{label}</text>')
    for tick in _nice_ticks(x_low, x_high, 8):
        x = px(tick)
        parts.append(f'<text x="{x:.2f}" y="{top + plot_h + 16}" text-anchor="middle">{_fmt(tick)}</text>')
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 2}" text-anchor="middle">step (iteration)'
        f"{' — log scale' if log else ''}</text>"
    )
    for epoch, first in (epoch_marks or {}).items():
        if x_low < first <= x_high:
            x = px(first)
            parts.append(f'<line class="epoch-mark" data-epoch="{epoch}" x1="{x:.2f}" y1="{top}" '
                         f'x2="{x:.2f}" y2="{top + plot_h}"/>')
            parts.append(f'<text class="epoch-label" x="{x + 2:.2f}" y="{top - 3}">epoch {epoch}</text>')
    shown = [n for n in names if n in series]
    for index, name in enumerate(shown):
        points = sorted(series[name]) if metric != "validation" else list(series[name])
        stride = max(1, math.ceil(len(points) / _MAX_POINTS_PER_LINE))
        points = points[::stride]
        colour = _LINE_COLOURS[index % len(_LINE_COLOURS)]
        line = points
        if metric == "loss" and len(points) > 4:
            window = max(3, len(points) // 20)
            for x, y in points:
                parts.append(f'<circle class="raw" cx="{px(x):.2f}" cy="{py(y):.2f}" r="1.6" fill="{colour}" '
                             'fill-opacity="0.25"/>')
            line = list(zip([x for x, _ in points], smooth([y for _, y in points], window), strict=True))
        coords = " ".join(f"{px(x):.2f},{py(y):.2f}" for x, y in line)
        parts.append(
            f'<polyline class="series" data-worker="{_esc(name)}" fill="none" stroke="{colour}" '
            f'stroke-width="1.8" points="{coords}"><title>{_esc(name)}</title></polyline>'
        )
        if len(points) <= 30 or metric == "validation":
            for x, y in points:
                parts.append(f'<circle cx="{px(x):.2f}" cy="{py(y):.2f}" r="2.5" fill="{colour}">'
                             f"<title>{_esc(name)} @ {_fmt(x)}: {_fmt(y)}</title></circle>")
    parts.append("</svg>")
    legend = "".join(
        f'<span><i style="background:{_LINE_COLOURS[i % len(_LINE_COLOURS)]}"></i>{_esc(n)}</span>'
        for i, n in enumerate(shown)
    )
    heading = _esc(_METRIC_TITLES.get(metric, metric))
    return f'<h3>{heading}</h3><div class="legend">{legend}</div>{"".join(parts)}'


def worker_summary(events: Sequence[Mapping[str, Any]], workers: Sequence[str]) -> list[dict[str, Any]]:
    """Per worker: partitions, steps, examples, examples/s (over its training span), bytes sent,
    waits (count, seconds, share of the span)."""
    rows = []
    for worker in workers:
        mine = [e for e in events if e["worker"] == worker]
        fits = [e for e in mine if e["kind"] == "fit"]
        waits = [e for e in mine if e["kind"] == "wait"]
        training = [e for e in mine if e["kind"] in ("fit", "wait", "encode", "apply")]
        span = (max(e["end"] for e in training) - min(e["start"] for e in training)) if training else 0.0
        examples = sum(int(e["examples"]) for e in fits if _is_number(e.get("examples")))
        wait_s = sum(e["end"] - e["start"] for e in waits)
        rows.append({
            "worker": worker,
            "partitions": sorted({int(e["partition"]) for e in mine if _is_number(e.get("partition"))
                                  and int(e["partition"]) >= 0}),
            "steps": len(fits),
            "examples": examples,
            "examples_per_s": examples / span if span > 0 else None,
            "bytes_sent": int(sum(e["bytes"] for e in mine
                                  if e["kind"] == "encode" and _is_number(e.get("bytes")))),
            "waits": len(waits),
            "wait_s": wait_s,
            "wait_share": wait_s / span if span > 0 else None,
        })
    return rows


def _worker_table(events: list[dict[str, Any]], workers: list[str], clocks: dict[str, str]) -> str:
    rows = []
    for row in worker_summary(events, workers):
        rate = f"{row['examples_per_s']:,.1f}" if row["examples_per_s"] is not None else "–"
        share = f"{row['wait_share'] * 100:.1f}%" if row["wait_share"] is not None else "–"
        parts = ", ".join(str(p) for p in row["partitions"]) or "–"
        rows.append(
            f'<tr class="worker-summary" data-worker="{_esc(row["worker"])}"><td>{_esc(row["worker"])}</td>'
            f"<td>{_esc(parts)}</td><td class=\"num\">{row['steps']:,}</td>"
            f"<td class=\"num\">{row['examples']:,}</td><td class=\"num\">{rate}</td>"
            f"<td class=\"num\">{row['bytes_sent']:,}</td><td class=\"num\">{row['waits']:,}</td>"
            f"<td class=\"num\">{row['wait_s']:.3f}</td><td class=\"num\">{share}</td>"
            f"<td>{_esc(clocks.get(row['worker'], '–'))}</td></tr>"
        )
    head = ("<tr><th>worker</th><th>partitions</th><th>steps</th><th>examples</th><th>examples/s</th>"
            "<th>bytes sent</th><th>waits for data</th><th>waiting (s)</th><th>waiting (share)</th>"
            "<th>clock (vs driver)</th></tr>")
    return f'<table class="workers">{head}{"".join(rows)}</table>'


def _summary(events: list[dict[str, Any]], workers: list[str]) -> str:
    kinds = sorted({e["kind"] for e in events}, key=lambda k: (k not in EVENT_KINDS, k))
    totals: dict[tuple[str, str], float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for record in events:
        totals[(record["worker"], record["kind"])] += record["end"] - record["start"]
        counts[record["worker"]] += 1
    head = "".join(f"<th>{_esc(kind_label(k))} (s)</th>" for k in kinds)
    rows = []
    for worker in workers:
        cells = "".join(f'<td class="num">{totals[(worker, k)]:.3f}</td>' for k in kinds)
        rows.append(f'<tr><td>{_esc(worker)}</td><td class="num">{counts[worker]}</td>{cells}</tr>')
    return f"<table><tr><th>worker</th><th>events</th>{head}</tr>{''.join(rows)}</table>"


def render_stats_html(
    stats: Iterable[Mapping[str, Any]] | Mapping[str, Any], title: str = "psrv training"
) -> str:
    """The report as one HTML string (see :func:`export_stats_html`)."""
    records = normalize_stats(stats)
    events = [r for r in records if "start" in r]
    workers = sorted({r["worker"] for r in records}, key=lambda w: (w == "driver", w))
    executors = [w for w in workers if w != "driver"]
    clocks = clock_notes(records)  # workers whose times were moved onto the driver's clock
    kinds = sorted({e["kind"] for e in events}, key=lambda k: (_LAYER.get(k, 2), k))
    if events:
        first = min(e["start"] for e in events)
        last = max(e["end"] for e in events)
        span = f"{_utc(first)} to {_utc(last)} ({last - first:.3f} s)"
    else:
        span = "no timed events"
    steps = sum(1 for e in events if e["kind"] == "fit")
    epochs = sorted({int(e["epoch"]) for e in events if _is_number(e.get("epoch"))})
    epoch_text = f", epochs {epochs[0]}–{epochs[-1]}" if len(epochs) > 1 else (
        f", epoch {epochs[0]}" if epochs else "")
    driver_text = " plus the driver" if "driver" in workers else ""
    marks = epoch_starts([r for r in records if r["kind"] == "fit"], "iteration")
    charts = []
    for metric in METRIC_FIELDS:
        series = _metric_series(records, metric)
        if series:
            charts.append(_chart(metric, series, workers, marks))
            if metric == "loss":
                validation = _validation_series(records)
                if validation:
                    charts.append(_chart("validation", validation, sorted(validation), marks))
    if not any('data-metric="loss"' in c for c in charts):
        validation = _validation_series(records)
        if validation:
            charts.insert(0, _chart("validation", validation, sorted(validation), marks))
    raw = json.dumps(records, default=str).replace("</", "<\\/")
    body = [
        f"<h1>{_esc(title)}: training statistics</h1>",
        f'<p class="headline">{len(executors)} worker(s){driver_text}; {steps:,} steps{epoch_text}; '
        f"{len(events)} event(s); {_esc(span)}. Generated {_esc(_utc(time.time()))}.</p>",
        f'<p class="caveat"><b>About the timestamps.</b> {_esc(CLOCK_CAVEAT)}'
        f'{" " + _esc(CLOCK_ALIGNED) if clocks else ""}</p>',
        "<h2>Timeline (one row per worker; dashed lines: epoch starts)</h2>",
        _legend(kinds),
        _timeline(events, workers),
        "<h2>Per worker</h2>",
        _worker_table(events, executors, clocks) if events and executors
        else '<p class="empty">No timed events.</p>',
        "<h2>Time per activity</h2>",
        _summary(events, workers) if events else '<p class="empty">No timed events.</p>',
        "<h2>Per-step metrics</h2>",
        "".join(charts) if charts else '<p class="empty">No per-step metrics were recorded.</p>',
        f'<script type="application/json" id="psrv-stats">{raw}</script>',
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}: training statistics</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def export_stats_html(
    stats: Iterable[Mapping[str, Any]] | Mapping[str, Any], path: str, *, title: str = "psrv training"
) -> str:
    """Write the report to ``path`` (a local path or any storage-layer URI, atomically) and return
    where it went (an absolute local path, or the URI).

    ``stats`` is what ``SparkNetwork.get_training_stats()`` returns (format: psrv.spark.observe.stats).
    The file needs no network access: styles and SVG are inline, the raw records are embedded as
    JSON (``<script id="psrv-stats">``) for other tools.
    """
    text = render_stats_html(stats, title)
    target = storage.absolute(path)
    storage.write_bytes(target, text.encode("utf-8"))
    return storage.local_path(target) if storage.is_local(target) else target
