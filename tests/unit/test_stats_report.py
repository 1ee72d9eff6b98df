"""The training-stats record format and the self-contained HTML report."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from psrv.spark.observe.report import CLOCK_CAVEAT, export_stats_html, render_stats_html
from psrv.spark.observe.stats import StatsFormatError, event, metrics_sample, normalize_stats

T0 = 1_763_800_000.0


def _stats(workers: int = 3, steps: int = 5) -> list[dict]:
    records: list[dict] = []
    for w in range(workers):
        name = f"host-{w}:{1000 + w}"
        clock = T0 + w * 0.01
        records.append(event(name, "catch_up", clock, clock + 0.2, bytes=4096))
        clock += 0.2
        for step in range(steps):
            records.append(event(name, "wait", clock, clock + 0.01))
            records.append(
                event(name, "fit", clock + 0.01, clock + 0.05, iteration=step, loss=2.0 / (step + 1))
            )
            records.append(
                event(
                    name,
                    "encode",
                    clock + 0.05,
                    clock + 0.06,
                    iteration=step,
                    threshold=1e-3 * 0.9**step,
                    sparsity=1e-3 * (step + 1),
                    bytes=400 + 10 * step,
                )
            )
            clock += 0.06
    records.append(event("driver", "averaging", T0 + 0.5, T0 + 0.6, round=0))
    records.append(metrics_sample("host-0:1000", T0 + 1.0, threshold=5e-4))
    return records


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(text: str) -> _Collector:
    parser = _Collector()
    parser.feed(text)
    parser.close()
    return parser


def test_report_has_one_timeline_row_per_worker_and_charts(tmp_path: Path) -> None:
    path = export_stats_html(_stats(), str(tmp_path / "sub" / "report.html"))
    text = Path(path).read_text(encoding="utf-8")
    parsed = _parse(text)
    rows = [a["data-worker"] for t, a in parsed.tags if t == "g" and a.get("class") == "timeline-row"]
    assert sorted(rows) == sorted(["host-0:1000", "host-1:1001", "host-2:1002", "driver"])
    events = [a for t, a in parsed.tags if t == "rect" and a.get("class") == "event"]
    assert len(events) == 3 * (1 + 5 * 3) + 1
    assert {a["data-kind"] for a in events} == {"catch_up", "wait", "fit", "encode", "averaging"}
    charts = {a["data-metric"] for t, a in parsed.tags if t == "svg" and a.get("class") == "chart"}
    assert charts == {"loss", "threshold", "sparsity", "bytes"}
    loss_lines = re.search(r'<svg class="chart" data-metric="loss".*?</svg>', text, re.S)
    assert loss_lines is not None and loss_lines.group(0).count('class="series"') == 3
    assert CLOCK_CAVEAT in text


def test_report_is_self_contained_and_svg_well_formed() -> None:
    text = render_stats_html(_stats(workers=2))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "no external resources"
    assert "http://" not in text and "https://" not in text
    for svg in re.findall(r"<svg.*?</svg>", text, re.S):
        ET.fromstring(svg)  # every chart is well-formed markup
    embedded = re.search(r'<script type="application/json" id="psrv-stats">(.*?)</script>', text, re.S)
    assert embedded is not None
    assert len(json.loads(embedded.group(1).replace("<\\/", "</"))) == len(_stats(workers=2))


def test_report_escapes_worker_names_and_survives_empty_metrics() -> None:
    stats = [event("<script>alert(1)</script>", "fit", T0, T0 + 1), event("w2", "custom-kind", T0, T0 + 0.5)]
    text = render_stats_html(stats)
    assert "<script>alert(1)</script>" not in text
    assert "No per-step metrics" in text
    assert "custom-kind" in text
    assert "No timed events" in render_stats_html([metrics_sample("w", T0, loss=1.0)])


def test_normalize_accepts_aliases_envelope_and_drops_bad_metrics() -> None:
    records = normalize_stats(
        {
            "version": 1,
            "events": [
                {"worker": 7, "kind": "wait_data", "start": T0 + 1, "end": T0 + 2, "loss": None},
                {"worker": "a", "kind": "encoding", "time": T0, "sparsity": float("nan"), "bytes": 12},
            ],
        }
    )
    assert [r["kind"] for r in records] == ["encode", "wait"]  # sorted by time, kinds canonical
    assert records[1]["worker"] == "7" and "loss" not in records[1]
    assert "sparsity" not in records[0] and records[0]["bytes"] == 12


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"kind": "fit", "start": 1, "end": 2}, "missing 'worker'"),
        ({"worker": "w", "kind": "fit", "start": 2, "end": 1}, "before 'start'"),
        ({"worker": "w", "kind": "fit", "start": 1}, "both 'start' and 'end'"),
        ({"worker": "w", "kind": "fit"}, "'start'/'end' \\(event\\) or 'time'"),
        ({"worker": "w", "kind": "fit", "start": "x", "end": 2}, "finite number"),
    ],
)
def test_bad_records_are_clear_errors(record: dict, message: str) -> None:
    with pytest.raises(StatsFormatError, match=message):
        normalize_stats([record])
    with pytest.raises(StatsFormatError, match="version"):
        normalize_stats({"version": 9, "events": []})
