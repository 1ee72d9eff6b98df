"""Run a test script the way a user does: ``spark-submit --master local-cluster[2,1,1024]`` with the
venv's Python on the executors and no source tree on their path; the script writes its results as
JSON to the path it is given."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
SUBMIT_DEADLINE_S = 840


def submit_script(name: str, work: Path, *conf: str) -> tuple[dict[str, Any], str]:
    """(the JSON the script ``scripts/<name>`` wrote, spark-submit's stdout); ``conf``: more
    ``--conf`` settings. A failed submit fails the test with the end of its stderr."""
    out = work / "results.json"
    return submit(SCRIPTS / name, [str(out)], out, work, *conf)


def submit(script: Path, arguments: list[str], out: Path, work: Path,
           *conf: str) -> tuple[dict[str, Any], str]:
    """spark-submit ``script arguments...`` from ``work``; (the JSON it wrote to ``out``, its stdout)."""
    launcher = Path(sys.executable).parent / "spark-submit"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the executors get no source tree
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    settings = ["spark.ui.enabled=false", "spark.ui.showConsoleProgress=false", "spark.driver.host=127.0.0.1",
                "spark.driver.bindAddress=127.0.0.1", "spark.driver.memory=1g", "spark.executor.memory=1g",
                *conf]
    command = [str(launcher), "--master", "local-cluster[2,1,1024]"]
    for setting in settings:
        command += ["--conf", setting]
    command += [str(script), *arguments]
    # its own process group: past the deadline the whole application goes (spark-submit's JVM, the Python
    # driver it started, the local cluster), not only spark-submit, which would leave the driver running
    with subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=SUBMIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"spark-submit ran past {SUBMIT_DEADLINE_S} s; its output:\n{stdout[-3000:]}\n"
                        f"{stderr[-3000:]}", pytrace=False)
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if done.returncode != 0 or not out.exists():
        pytest.fail(f"spark-submit exited {done.returncode}:\n{done.stderr[-4000:]}", pytrace=False)
    return json.loads(out.read_text()), done.stdout
