"""The export approach on a cluster whose executors are on two hosts and see no shared temporary
directory: refused clearly by default, trains with a shared file:// export_directory.

The cluster (a standalone master and two workers on 127.0.0.1 and 127.0.0.2, each with its own
TMPDIR and local dirs) runs in a subprocess with its own JVMs and deadline, since the test run's
session is a one-host local-cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SCRIPT = Path(__file__).with_name("multihost_export_run.py")


@pytest.mark.timeout(300)
def test_default_export_refused_on_two_hosts_and_shared_uri_trains(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                              timeout=260, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the two-host cluster run did not finish within 260 s: {str(exc.stdout)[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result (rc {done.returncode}): {done.stdout[-2000:]} {done.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert "error" not in result, result
    assert result["hosts"] == ["127.0.0.2", "driver"]  # 127.0.0.1 is the driver's own address
    assert result["default"].startswith("ExportUnreachableError")
    assert "export_directory" in result["default"] and 'rdd_training_approach="direct"' in result["default"]
    assert result["shared"]["changed"] and result["shared"]["files"] == 16  # 256 examples / 16
