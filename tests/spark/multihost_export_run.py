"""A Spark standalone cluster whose two executors sit on two "hosts" (127.0.0.1 and 127.0.0.2, each
worker with its own TMPDIR and local dirs), for the export approach's multi-host check.

Run by tests/spark/test_multihost_export.py in a subprocess (its own JVMs, its own deadline).
Prints one JSON line: what the default export did (refused, with which message) and what a fit with
a shared file:// export_directory did. Usage: python multihost_export_run.py WORKDIR
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

DEADLINE_S = 150.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _spark_class(spark_home: str, args: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([os.path.join(spark_home, "bin", "spark-class"), *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def main(workdir: str) -> int:
    import pyspark

    started = time.monotonic()
    spark_home = os.path.dirname(os.path.abspath(pyspark.__file__))
    base_env = {**os.environ, "SPARK_HOME": spark_home, "PYSPARK_PYTHON": sys.executable,
                "SPARK_NO_DAEMONIZE": "1"}
    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes = [_spark_class(spark_home, ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                           "--port", str(port), "--webui-port", str(_free_port())],
                              {**base_env, "SPARK_LOCAL_IP": "127.0.0.1"},
                              os.path.join(workdir, "master.log"))]
    for number, host in enumerate(("127.0.0.1", "127.0.0.2")):
        private = os.path.join(workdir, f"host{number}")
        os.makedirs(os.path.join(private, "tmp"), exist_ok=True)
        env = {**base_env, "SPARK_LOCAL_IP": host, "TMPDIR": os.path.join(private, "tmp"),
               "SPARK_LOCAL_DIRS": os.path.join(private, "tmp")}
        processes.append(_spark_class(
            spark_home, ["org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1", "--memory",
                         "1g", "--webui-port", str(_free_port()), "--work-dir", os.path.join(private, "work"),
                         master_url], env, os.path.join(workdir, f"worker{number}.log")))
    result: dict = {}
    session = None
    try:
        from pyspark.sql import SparkSession

        os.environ.update({"PYSPARK_PYTHON": sys.executable, "SPARK_HOME": spark_home})
        time.sleep(3.0)
        session = (SparkSession.builder.master(master_url).appName("psrv-multihost")
                   .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1").config("spark.executor.memory", "512m")
                   .config("spark.executor.cores", "1").config("spark.cores.max", "2")
                   .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable).getOrCreate())
        sc = session.sparkContext
        sc.setLogLevel("ERROR")
        from psrv.spark.data.export import executor_hosts

        while len(executor_hosts(sc)) < 2 or sc._jsc.sc().getExecutorMemoryStatus().size() < 3:
            if time.monotonic() - started > DEADLINE_S / 2:
                raise TimeoutError(f"executors did not register: hosts {sorted(executor_hosts(sc))}")
            time.sleep(0.5)
        result["hosts"] = sorted(executor_hosts(sc))

        import numpy as np
        from psrv.nn import Dense, Network, Output
        from psrv.nn.data import DataSet
        from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork

        rng = np.random.default_rng(0)
        x = rng.normal(size=(256, 4)).astype(np.float32)
        data = DataSet.from_class_indices(x, (x[:, 0] > 0).astype(np.int64), 2)
        rdd = sc.parallelize(list(data.batches(32)), 2)

        def network() -> Network:
            return Network([Dense(8, "relu"), Output(2)], input_shape=(4,), seed=1)

        try:
            SparkNetwork(sc, network(), ParameterAveragingTrainingMaster(batch_size_per_worker=16)).fit(rdd)
            result["default"] = "trained"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result["default"] = f"{type(exc).__name__}: {exc}"
        shared = "file://" + os.path.join(workdir, "shared-export")
        net = network()
        before = net.params.copy()
        master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, export_directory=shared)
        SparkNetwork(sc, net, master).fit(rdd)
        written = sum(len(f) for _, _, f in os.walk(os.path.join(workdir, "shared-export")))
        result["shared"] = {"changed": bool(np.abs(net.params - before).sum() > 0), "files": written,
                            "accuracy": float(net.evaluate(data).accuracy())}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if session is not None:
            session.stop()
        for process in processes:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
