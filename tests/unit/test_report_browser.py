"""The HTML report rendered by a real browser: headless Chromium draws it, we look at the pixels and the DOM.

Needs Debian's ``chromium`` (``.ci/run`` installs it when missing); skips with the reason only where
no Chromium can be found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from psrv.spark.observe.report import export_stats_html, kind_colour
from report_data import run_stats

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_DEADLINE_S = 120


def _browser() -> str:
    for name in _BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"no headless Chromium on PATH (looked for {', '.join(_BROWSERS)}); "
                "install Debian's package: apt-get install chromium (.ci/run does)")


def _run(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *args]
    env = {**os.environ, "HOME": str(profile)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=_DEADLINE_S, env=env,
                            check=False)
    assert result.returncode == 0, f"{command} exited {result.returncode}: {result.stderr[-2000:]}"
    return result


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[str] = []
        self.charts: list[str] = []
        self.summary_rows: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "g" and found.get("class") == "timeline-row":
            self.rows.append(str(found.get("data-worker")))
        if tag == "svg" and found.get("class") == "chart":
            self.charts.append(str(found.get("data-metric")))
        if tag == "tr" and found.get("class") == "worker-summary":
            self.summary_rows.append(str(found.get("data-worker")))


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    from PIL import Image

    browser = _browser()
    stats = run_stats(workers=3, epochs=2, steps=20)
    workers = sorted({r["worker"] for r in stats}, key=lambda w: (w == "driver", w))
    report = Path(export_stats_html(stats, str(tmp_path / "report.html"), title="browser check"))
    shot = tmp_path / "report.png"
    _run(browser, tmp_path / "profile", "--window-size=1200,2400", f"--screenshot={shot}", report.as_uri())
    dom = _Dom()
    dom.feed(_run(browser, tmp_path / "profile", "--dump-dom", report.as_uri()).stdout)

    # the DOM the browser built: one timeline row per worker (driver included), the charts, the table
    assert dom.rows == workers
    assert {"loss", "validation", "threshold", "sparsity", "bytes"} <= set(dom.charts)
    assert dom.summary_rows == [w for w in workers if w != "driver"]

    # the pixels: not a blank page, and the timeline's fit steps and the loss lines were drawn
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2400)
    pixels = np.asarray(image, dtype=np.int16).reshape(-1, 3)
    white = int(np.count_nonzero(pixels.min(axis=1) >= 245))
    assert white < 0.97 * len(pixels), "the page is (nearly) blank"
    assert len(np.unique(pixels, axis=0)) > 50

    def count(colour: str, tolerance: int = 6) -> int:
        return int(np.count_nonzero(np.abs(pixels - np.array(_rgb(colour))).max(axis=1) <= tolerance))

    assert count(kind_colour("fit")) > 500, "fit steps not visible on the timeline"
    assert count(kind_colour("wait")) > 20 and count(kind_colour("flush")) > 20
