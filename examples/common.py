"""What every example shares: its Spark session (the master spark-submit gives, else ``local[2]``), the
gradient-sharing configuration for one machine, and how it prints its result.

Copy this file with the example you start from."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def spark_session(app: str) -> Any:
    """The session of ``spark-submit --master ...``; run with plain ``python``, a ``local[2]`` one."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app).config("spark.ui.showConsoleProgress", "false")
    if not SparkConf().contains("spark.master"):  # plain python: two local workers on this machine
        builder = (builder.master("local[2]").config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def sharing_master(batch_size: int, threshold: float = 1e-3) -> Any:
    """A ``SharedTrainingMaster`` for one machine: any free port, a plain mesh, a patient join (the
    executors import torch first)."""
    from psrv.encoding import AdaptiveThreshold
    from psrv.spark import SharedTrainingMaster, VoidConfiguration

    conf = VoidConfiguration(unicast_port=0, mesh_build_mode="plain", join_timeout_ms=120_000)
    return SharedTrainingMaster(conf, batch_size_per_worker=batch_size,
                                threshold_algorithm=AdaptiveThreshold(threshold), progress=False)


def parser(description: str) -> argparse.ArgumentParser:
    """The options every example takes; ``description``: the example's docstring, shown by ``--help``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=None,
                   help="folder for the generated data and outputs (default: a fresh temporary folder)")
    p.add_argument("--json", default=None, help="also write the result as JSON to this file")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    return p


def report(name: str, result: dict[str, Any], json_path: str | None) -> None:
    """Print the result, one ``key: value`` per line; with ``--json`` write it there too."""
    print(f"{name}:")
    for key, value in result.items():
        print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)


__all__ = ["parser", "report", "sharing_master", "spark_session"]
