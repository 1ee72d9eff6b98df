"""The training-statistics report: one self-contained HTML file (inline SVG, no network access).

``export_stats_html(stats, path)`` takes the records described in :mod:`psrv.spark.stats` and
writes a timeline with one row per worker (each activity a coloured bar, hover for details) and
one line chart per metric (loss, threshold, sparsity, bytes per step; one line per worker).
"""

from __future__ import annotations

import html
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psrv.spark.stats import EVENT_KINDS, METRIC_FIELDS, normalize_stats

__all__ = ["CLOCK_CAVEAT", "export_stats_html", "render_stats_html"]

CLOCK_CAVEAT = (
    "Timestamps are taken from the wall clock (time.time()) of the machine each worker ran on. "
    "Clocks of different machines may disagree by milliseconds to seconds, so the alignment of "
    "events across rows is approximate; within one row, order and durations are exact."
)

_KIND_COLOURS = {
    "catch_up": "#8e44ad",
    "setup": "#7f8c8d",
    "fit": "#2e86de",
    "wait": "#f39c12",
    "encode": "#27ae60",
    "apply": "#16a085",
    "averaging": "#c0392b",
}
_OTHER_COLOUR = "#b2bec3"
_LINE_COLOURS = ["#2e86de", "#e74c3c", "#27ae60", "#8e44ad", "#f39c12", "#16a085", "#d35400", "#2c3e50"]
_METRIC_TITLES = {
    "loss": "Loss per step",
    "threshold": "Encoding threshold per step",
    "sparsity": "Sparsity per step (fraction of parameters sent)",
    "bytes": "Bytes per step (encoded message size)",
}
_MAX_POINTS_PER_LINE = 2000
_ROW_HEIGHT = 22
_LABEL_WIDTH = 170
_PLOT_WIDTH = 900

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 24px; color: #2d3436; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.caveat { background: #fff8e1; border-left: 4px solid #f39c12; padding: 8px 12px; max-width: 1060px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { padding: 3px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.legend span { display: inline-block; margin-right: 14px; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
svg text { font-size: 11px; fill: #2d3436; }
svg .event:hover { stroke: #2d3436; stroke-width: 1; }
.empty { color: #636e72; font-style: italic; }
"""


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
        colour = _KIND_COLOURS.get(kind, _OTHER_COLOUR)
        label = EVENT_KINDS.get(kind, kind)
        items.append(f'<span><i style="background:{colour}"></i>{_esc(label)}</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _event_tooltip(record: Mapping[str, Any], origin: float) -> str:
    duration_ms = (record["end"] - record["start"]) * 1000.0
    lines = [
        f"{record['worker']}: {EVENT_KINDS.get(record['kind'], record['kind'])}",
        f"start {_utc(record['start'])} (+{record['start'] - origin:.3f} s)",
        f"duration {duration_ms:.1f} ms",
    ]
    for key, value in record.items():
        if key not in ("worker", "kind", "start", "end"):
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _timeline(events: list[dict[str, Any]], workers: list[str]) -> str:
    if not events:
        return '<p class="empty">No timed events were recorded.</p>'
    origin = min(e["start"] for e in events)
    span = max(max(e["end"] for e in events) - origin, 1e-6)
    height = _ROW_HEIGHT * len(workers) + 30
    width = _LABEL_WIDTH + _PLOT_WIDTH + 20
    scale = _PLOT_WIDTH / span
    parts = [f'<svg class="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in events:
        by_worker[record["worker"]].append(record)
    for row, worker in enumerate(workers):
        y = row * _ROW_HEIGHT
        parts.append(f'<g class="timeline-row" data-worker="{_esc(worker)}">')
        shade = "#f7f9fa" if row % 2 == 0 else "#ffffff"
        parts.append(f'<rect x="0" y="{y}" width="{width}" height="{_ROW_HEIGHT}" fill="{shade}"/>')
        label = worker if len(worker) <= 26 else worker[:12] + "…" + worker[-12:]
        parts.append(f'<text x="4" y="{y + 15}"><title>{_esc(worker)}</title>{_esc(label)}</text>')
        for record in by_worker[worker]:
            x = _LABEL_WIDTH + (record["start"] - origin) * scale
            w = max((record["end"] - record["start"]) * scale, 0.8)
            colour = _KIND_COLOURS.get(record["kind"], _OTHER_COLOUR)
            parts.append(
                f'<rect class="event" data-kind="{_esc(record["kind"])}" x="{x:.2f}" y="{y + 3}" '
                f'width="{w:.2f}" height="{_ROW_HEIGHT - 6}" fill="{colour}">'
                f"<title>{_esc(_event_tooltip(record, origin))}</title></rect>"
            )
        parts.append("</g>")
    axis_y = _ROW_HEIGHT * len(workers) + 4
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
        if metric not in record:
            continue
        worker = record["worker"]
        iteration = record.get("iteration")
        if (
            isinstance(iteration, int | float)
            and not isinstance(iteration, bool)
            and math.isfinite(iteration)
        ):
            x = float(iteration)
        else:
            x = float(steps[worker])
        steps[worker] += 1
        series[worker].append((x, float(record[metric])))
    return series


def _chart(metric: str, series: Mapping[str, Sequence[tuple[float, float]]], workers: list[str]) -> str:
    width, height, left, bottom, top = _LABEL_WIDTH + _PLOT_WIDTH + 20, 260, 70, 30, 10
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
    for index, worker in enumerate(w for w in workers if w in series):
        points = list(series[worker])
        stride = max(1, math.ceil(len(points) / _MAX_POINTS_PER_LINE))
        points = points[::stride]
        colour = _LINE_COLOURS[index % len(_LINE_COLOURS)]
        coords = " ".join(f"{px(x):.2f},{py(y):.2f}" for x, y in points)
        parts.append(
            f'<polyline class="series" data-worker="{_esc(worker)}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5" points="{coords}"><title>{_esc(worker)}</title></polyline>'
        )
        if len(points) == 1:
            x, y = points[0]
            parts.append(f'<circle cx="{px(x):.2f}" cy="{py(y):.2f}" r="3" fill="{colour}"/>')
    parts.append("</svg>")
    legend = "".join(
        f'<span><i style="background:{_LINE_COLOURS[i % len(_LINE_COLOURS)]}"></i>{_esc(w)}</span>'
        for i, w in enumerate(w for w in workers if w in series)
    )
    heading = _esc(_METRIC_TITLES.get(metric, metric))
    return f'<h3>{heading}</h3><div class="legend">{legend}</div>{"".join(parts)}'


def _summary(events: list[dict[str, Any]], workers: list[str]) -> str:
    kinds = sorted({e["kind"] for e in events}, key=lambda k: (k not in EVENT_KINDS, k))
    totals: dict[tuple[str, str], float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for record in events:
        totals[(record["worker"], record["kind"])] += record["end"] - record["start"]
        counts[record["worker"]] += 1
    head = "".join(f"<th>{_esc(EVENT_KINDS.get(k, k))} (s)</th>" for k in kinds)
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
    kinds = sorted({e["kind"] for e in events}, key=lambda k: (k not in EVENT_KINDS, k))
    if events:
        first = min(e["start"] for e in events)
        last = max(e["end"] for e in events)
        span = f"{_utc(first)} to {_utc(last)} ({last - first:.3f} s)"
    else:
        span = "no timed events"
    charts = []
    for metric in METRIC_FIELDS:
        series = _metric_series(records, metric)
        if series:
            charts.append(_chart(metric, series, workers))
    raw = json.dumps(records, default=str).replace("</", "<\\/")
    body = [
        f"<h1>{_esc(title)}: training statistics</h1>",
        f"<p>{len(workers)} worker(s), {len(events)} event(s); {_esc(span)}. "
        f"Generated {_esc(_utc(time.time()))}.</p>",
        f'<p class="caveat"><b>About the timestamps.</b> {_esc(CLOCK_CAVEAT)}</p>',
        "<h2>Timeline (one row per worker)</h2>",
        _legend(kinds),
        _timeline(events, workers),
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

    ``stats`` is what ``SparkNetwork.get_training_stats()`` returns (format: psrv.spark.stats).
    The file needs no network access: styles and SVG are inline, the raw records are embedded as
    JSON (``<script id="psrv-stats">``) for other tools.
    """
    text = render_stats_html(stats, title)
    from psrv.spark import storage

    target = storage.absolute(path)
    storage.write_bytes(target, text.encode("utf-8"))
    return storage.local_path(target) if storage.is_local(target) else target
