"""A script run as ``.venv/bin/python script.py`` (README's own style) without PYSPARK_PYTHON: Spark's
executors start ``python3`` from PATH, which has no psrv. The fit used to fail on the executors after
seconds of retries with ``ModuleNotFoundError: No module named 'psrv'``; the driver's environment check
now says which Python the executors run, what differs and how to point them at the driver's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = '''
import json, sys, time
import numpy as np
from psrv.nn import Dense, Network, Output, Sgd
from psrv.nn.data import DataSet
from psrv.spark import SharedTrainingMaster, SparkNetwork
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("psrv-env-check")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
data = spark.sparkContext.parallelize([DataSet(x, np.eye(2, dtype=np.float32)[(x[:, 0] > 0).astype(int)])], 2)
network = Network([Dense(8), Output(2)], input_shape=(4,), updater=Sgd(0.1), seed=1)
started = time.monotonic()
try:
    SparkNetwork(spark, network, SharedTrainingMaster(batch_size_per_worker=16)).fit(data)
    result = {"ok": True}
except Exception as exc:
    result = {"ok": False, "type": type(exc).__name__, "error": str(exc)}
result["seconds"] = time.monotonic() - started
open(sys.argv[1], "w").write(json.dumps(result))
spark.stop()
'''


def _user_shell() -> dict[str, str]:
    """A shell without the tests' settings: no PYSPARK_PYTHON, the venv's bin not on PATH."""
    dropped = {"PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
               "PYSPARK_SUBMIT_ARGS"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def test_executors_without_psrv_get_the_environment_message(tmp_path) -> None:
    env = _user_shell()
    python3 = shutil.which("python3", path=env["PATH"])
    assert python3 is not None
    has_psrv = subprocess.run([python3, "-c", "import psrv"], env=env, capture_output=True, timeout=60)
    assert has_psrv.returncode != 0, f"{python3} imports psrv: this test needs a python3 on PATH without it"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(script), str(out)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=540)
    assert out.exists(), f"exit {done.returncode}:\n{done.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert not result["ok"] and result["type"] == "SparkConfigError", result
    error = result["error"]
    assert "psrv cannot be imported there (ModuleNotFoundError: No module named 'psrv')" in error, error
    assert f"export PYSPARK_PYTHON={sys.executable}" in error and "spark.pyspark.python" in error, error
    assert "the Spark executors run Python" in error and "venv-pack" in error, error
    assert result["seconds"] < 60, result  # one probe task, not a training job's retries
