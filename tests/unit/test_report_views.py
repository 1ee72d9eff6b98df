"""The report's views of a run (worker count, kinds, epochs, smoothing, validation, per-worker table)
and the Chrome / Perfetto trace export."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from psrv.spark.observe.report import (
    _KIND_COLOURS,
    kind_colour,
    kind_label,
    render_stats_html,
    smooth,
    worker_summary,
)
from psrv.spark.observe.stats import EVENT_KINDS
from psrv.spark.observe.trace import chrome_trace, export_chrome_trace
from report_data import run_stats


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def having(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and all(a.get(k.replace("_", "-")) == v
                                                             for k, v in attrs.items())]


def _parsed(text: str) -> _Tags:
    parser = _Tags()
    parser.feed(text)
    return parser


def test_headline_counts_workers_without_the_driver() -> None:
    text = render_stats_html(run_stats(workers=3, epochs=1, steps=4))
    assert "3 worker(s) plus the driver" in text
    assert "12 steps" in text


def test_every_kind_has_its_own_colour_and_a_readable_name() -> None:
    assert len(set(_KIND_COLOURS.values())) == len(_KIND_COLOURS)
    assert set(EVENT_KINDS) <= set(_KIND_COLOURS)
    assert all("_" not in kind_label(kind) for kind in EVENT_KINDS)
    assert kind_label("my_custom_kind") == "my custom kind"
    assert kind_colour("my_custom_kind") == kind_colour("my_custom_kind")  # stable
    assert kind_colour("my_custom_kind") not in _KIND_COLOURS.values()
    parsed = _parsed(render_stats_html(run_stats(epochs=1, steps=3)))
    legend = {a["data-kind"] for a in parsed.having("span") if a.get("data-kind")}
    drawn = {a["data-kind"] for a in parsed.having("rect", **{"class": "event"})}
    assert legend == drawn and {"fit", "wait", "encode", "flush", "training_job", "export"} <= drawn
    fills = {a["data-kind"]: a["fill"] for a in parsed.having("rect", **{"class": "event"})}
    assert len(set(fills.values())) == len(fills)


def test_epoch_boundaries_are_marked_on_the_timeline_and_charts() -> None:
    parsed = _parsed(render_stats_html(run_stats(epochs=3, steps=5)))
    marks = parsed.having("line", **{"class": "epoch-mark"})
    timeline_epochs = {a["data-epoch"] for a in marks}
    assert timeline_epochs == {"1", "2", "3"}  # epochs count from 1, as the progress line does
    # charts mark epochs 2 and 3 (epoch 1 starts at the first step: its left edge)
    assert sum(1 for a in marks if a["data-epoch"] == "2") >= 2


def test_loss_is_smoothed_with_raw_points_and_validation_is_charted() -> None:
    text = render_stats_html(run_stats(workers=2, epochs=2, steps=20))
    loss = re.search(r'<svg class="chart" data-metric="loss".*?</svg>', text, re.S).group(0)
    assert loss.count('class="raw"') == 2 * 40  # every step, faint
    assert loss.count('class="series"') == 2  # one smoothed line per worker
    validation = re.search(r'<svg class="chart" data-metric="validation".*?</svg>', text, re.S)
    assert validation is not None
    assert {"accuracy", "f1"} == set(re.findall(r'class="series" data-worker="([^"]+)"', validation.group(0)))
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_sparsity_chart_plots_elements_over_parameters() -> None:
    stats = run_stats(workers=1, epochs=1, steps=3)
    text = render_stats_html(stats)
    assert "Sparsity per step (elements sent / parameters)" in text
    encodes = [r for r in stats if r["kind"] == "encode"]
    assert all(r["sparsity"] == r["elements"] / 18_000 for r in encodes)


def test_per_worker_table() -> None:
    stats = run_stats(workers=2, epochs=2, steps=10)
    workers = ["executor-0:4100", "executor-1:4101"]
    rows = worker_summary([r for r in stats if "start" in r], workers)
    for row, worker in zip(rows, workers, strict=True):
        mine = [r for r in stats if r["worker"] == worker]
        assert row["steps"] == 20 and row["examples"] == 320
        assert row["bytes_sent"] == sum(r["bytes"] for r in mine if r["kind"] == "encode")
        assert row["waits"] == 20
        assert row["wait_s"] == pytest.approx(sum(r["end"] - r["start"] for r in mine if r["kind"] == "wait"))
        assert 0 < row["wait_share"] < 1 and row["examples_per_s"] > 0
        assert row["partitions"] == [int(worker[9])]
    parsed = _parsed(render_stats_html(stats))
    assert [a["data-worker"] for a in parsed.having("tr", **{"class": "worker-summary"})] == workers


def test_chrome_trace_structure(tmp_path: Path) -> None:
    stats = run_stats(workers=2, epochs=2, steps=4)
    path = export_chrome_trace(stats, str(tmp_path / "trace" / "run.json"))
    trace = json.loads(Path(path).read_text(encoding="utf-8"))
    assert trace == json.loads(json.dumps(chrome_trace(stats)))
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for item in events:
        assert item["ph"] in {"M", "X", "C", "i"}
        assert isinstance(item["pid"], int) and isinstance(item["tid"], int) and isinstance(item["name"], str)
        if item["ph"] != "M":
            assert isinstance(item["ts"], int | float) and item["ts"] >= 0
        if item["ph"] == "X":
            assert item["dur"] >= 0 and isinstance(item["args"], dict) and item["cat"]
        if item["ph"] == "C":
            assert all(isinstance(v, float) for v in item["args"].values())
    names = {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(names) == {"executor-0:4100", "executor-1:4101", "driver"}
    timed = [r for r in stats if "start" in r]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(timed)
    # one process per worker, each event on its worker's process, durations in microseconds
    origin = min(r.get("start", r.get("time")) for r in stats)
    for record, item in zip(sorted(timed, key=lambda r: (r["start"], r["worker"])), complete, strict=True):
        assert item["pid"] == names[record["worker"]]
        assert item["ts"] == pytest.approx((record["start"] - origin) * 1e6, abs=1)
        assert item["dur"] == pytest.approx((record["end"] - record["start"]) * 1e6, abs=1)
        assert item["name"] == kind_label(record["kind"])
    assert {e["name"] for e in events if e["ph"] == "i"} == {"epoch 1", "epoch 2"}  # 1-based, as everywhere
    assert {"loss", "threshold", "sparsity", "bytes", "validation accuracy"} <= {
        e["name"] for e in events if e["ph"] == "C"}
