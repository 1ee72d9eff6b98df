"""`psrv demo` end to end in its own process (its own local Spark), plus its --help."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _umask() -> int:
    from psrv.nn._files import current_umask

    return current_umask()


def _psrv() -> list[str]:
    exe = shutil.which("psrv") or str(Path(sys.executable).with_name("psrv"))
    return [exe] if Path(exe).exists() else [sys.executable, "-m", "psrv.server.cli"]


@pytest.mark.timeout(60)
def test_demo_help_explains_every_option() -> None:
    result = subprocess.run([*_psrv(), "demo", "--help"], capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr
    for option in ("--workers", "--epochs", "--master", "--output", "--report", "(default: 2)"):
        assert option in result.stdout


@pytest.mark.timeout(240)
def test_demo_trains_reports_bytes_and_saves(tmp_path) -> None:
    output = tmp_path / "demo.psrv"
    report = tmp_path / "report"
    command = [*_psrv(), "demo", "--epochs", "2", "--output", str(output), "--report", str(report),
               "--log-level", "INFO"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=220, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "final test accuracy:" in result.stdout
    assert "x less)" in result.stdout
    # --report DIR: the HTML report, the trace and a TensorBoard log of the run, and where they are
    html = (report / "report.html").read_text(encoding="utf-8")
    assert f"report: {report / 'report.html'}" in result.stdout
    assert "2 worker(s) plus the driver" in html and 'data-metric="validation"' in html
    assert (report / "trace.json").stat().st_size > 0
    events = list((report / "tensorboard").glob("events.out.tfevents.*"))
    assert events and f"TensorBoard log: {report / 'tensorboard'}" in result.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(report / "tensorboard"))
    board.Reload()
    assert {"master/loss", "validation/accuracy", "worker/p0/sparsity"} <= set(board.Tags()["scalars"])
    assert len(board.Scalars("validation/accuracy")) == 2
    assert "training:" in result.stderr and "training:" not in result.stdout  # the progress bar: stderr
    assert "epoch   1:" in result.stdout
    assert output.stat().st_mode & 0o777 == 0o666 & ~_umask()  # the user's umask, not private
    from psrv.nn import Network

    network = Network.load(output)
    assert network.num_params > 0
