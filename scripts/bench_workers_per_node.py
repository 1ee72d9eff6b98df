"""One mesh member per worker against N workers per node (``workers_per_node=N``), on digits.

The same total of workers (--hosts x --per-node) trains the same network for --epochs epochs two ways, each
in its own ``local-cluster[H,N,MEM]`` session (H executors of N cores: H "hosts"):

- ``member per worker``: H x N Spark tasks (``spark.task.cpus=1``), each its own mesh member: N Python
  worker processes per host, each with its own replica, residual and replay ring;
- ``N per node``: H tasks (``spark.task.cpus=N``, one per executor), each ONE mesh member with N local
  worker threads whose steps are summed before one message goes on the wire.

Figures, medians of --runs runs (after one warm-up fit per session, not counted):

- bytes on the wire: what the workers' nodes sent and received (their transport counters), per epoch;
- controller fan-out: the mesh members of an epoch (the controller relays each update to all others);
- memory per host: the peak, sampled every 0.2 s during fit, of the summed RSS (psutil) of each executor's
  Python processes (the daemon and its workers), median over the hosts; the executor JVM's RSS beside it;
- time per epoch: the wall time of ``fit(epochs=E)`` / E; and the test accuracy reached.

The session start-ups are not timed. Ratios are N-per-node over member-per-worker, from the same run.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import threading
import time

import numpy as np
import psutil
from bench_spark import digits_data
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration

VARIANTS = ("member per worker", "N per node")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2, help="executors of local-cluster (default 2)")
    parser.add_argument("--per-node", type=int, default=2, help="workers per host, N (default 2)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per fit (default 3)")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant, median reported (default 3)")
    parser.add_argument("--hidden", type=int, default=256, help="units of the hidden layer (default 256)")
    parser.add_argument("--executor-memory", type=int, default=1024, help="MiB per executor (default 1024)")
    return parser.parse_args(argv)


def _session(hosts: int, cores: int, task_cpus: int, memory: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_HOME", os.path.dirname(os.path.abspath(pyspark.__file__)))
    session = (SparkSession.builder.master(f"local-cluster[{hosts},{cores},{memory}]")
               .appName("psrv-bench-workers-per-node")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.task.cpus", str(task_cpus))
               .config("spark.default.parallelism", str(hosts * cores // task_cpus)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + 300
    while session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < hosts \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return session


def _executors() -> list[psutil.Process]:
    """The executor JVMs under this driver (local-cluster starts them as the driver JVM's children)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("CoarseGrainedExecutorBackend" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _rss(process: psutil.Process) -> tuple[int, int]:
    """(the summed RSS of an executor's Python processes, the executor JVM's own RSS), bytes."""
    python = 0
    try:
        jvm = process.memory_info().rss
        for child in process.children(recursive=True):
            try:
                if "python" in child.name().lower():
                    python += child.memory_info().rss
            except psutil.Error:
                continue
    except psutil.Error:
        return 0, 0
    return python, jvm


class _PeakMemory:
    """Samples every executor's memory while a fit runs; keeps each one's peak."""

    def __init__(self) -> None:
        self.executors = _executors()
        self.peaks = {p.pid: (0, 0) for p in self.executors}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for process in self.executors:
                python, jvm = _rss(process)
                old = self.peaks[process.pid]
                self.peaks[process.pid] = (max(old[0], python), max(old[1], jvm))
            self._stop.wait(0.2)

    def __enter__(self) -> _PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _network(hidden: int, seed: int) -> Network:
    return Network([Dense(hidden, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2),
                   seed=seed)


def _fit(sc, rdd, test, args: argparse.Namespace, variant: str, seed: int) -> dict:
    per_node = args.per_node if variant == "N per node" else 1
    tasks = args.hosts * args.per_node // per_node
    conf = VoidConfiguration(unicast_port=0, join_timeout_ms=180_000)  # a busy machine starts tasks slowly
    master = SharedTrainingMaster(conf, batch_size_per_worker=16,
                                  num_workers=tasks, threshold_algorithm=AdaptiveThreshold(3e-2),
                                  collect_training_stats=True, progress=False, workers_per_node=per_node)
    spark_net = SparkNetwork(sc, _network(args.hidden, seed), master)
    fits: list[dict] = []
    original = master._finish

    def keep(*a, **k):  # each epoch's figures
        original(*a, **k)
        fits.append(dict(master.last_fit))

    master._finish = keep
    with _PeakMemory() as memory:
        started = time.perf_counter()
        spark_net.fit(rdd, epochs=args.epochs)
        wall = time.perf_counter() - started
    wire = sum(int(e.get("bytes_received", 0)) + int(e.get("bytes_sent_total", 0))
               for e in master.training_stats if e.get("kind") == "metrics")
    peaks = list(memory.peaks.values()) or [(0, 0)]
    return {
        "epoch_s": wall / args.epochs,
        "wire_mb_per_epoch": wire / args.epochs / 1e6,
        "sent_mb_per_epoch": sum(f["bytes_sent"] for f in fits) / args.epochs / 1e6,
        "members": statistics.median(f["mesh_members"] for f in fits),
        "messages_per_epoch": sum(f["messages"] for f in fits) / args.epochs,
        "python_mb_per_host": statistics.median(p[0] for p in peaks) / 2**20,
        "jvm_mb_per_host": statistics.median(p[1] for p in peaks) / 2**20,
        "missing": sum(f["updates_missing"] for f in fits),
        "diverged": sum(f["replicas_diverged"] for f in fits),
        "accuracy": float(spark_net.network.evaluate(test).accuracy()),
    }


def _variant_runs(args: argparse.Namespace, variant: str, train, test) -> list[dict]:
    per_node = args.per_node if variant == "N per node" else 1
    session = _session(args.hosts, args.per_node, per_node, args.executor_memory)
    try:
        sc = session.sparkContext
        rdd = sc.parallelize(list(train.batches(50)), args.hosts * args.per_node).cache()
        rdd.count()
        _fit(sc, rdd, test, argparse.Namespace(**{**vars(args), "epochs": 1}), variant, 99)  # warm-up
        return [_fit(sc, rdd, test, args, variant, seed) for seed in range(args.runs)]
    finally:
        session.stop()
        time.sleep(2)  # the executors exit before the next session starts


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    train, test = digits_data()
    load_before = os.getloadavg()
    runs = {variant: _variant_runs(args, variant, train, test) for variant in VARIANTS}
    load_after = os.getloadavg()
    rows = {name: {k: statistics.median(r[k] for r in found) for k in found[0]}
            for name, found in runs.items()}
    base = rows[VARIANTS[0]]
    print(f"digits, Dense({args.hidden}) -> 10, {args.hosts} hosts x {args.per_node} workers, {args.epochs} "
          f"epochs, median of {args.runs} runs; load average before {load_before[0]:.1f}, after "
          f"{load_after[0]:.1f} (1 min), {os.cpu_count()} cores")
    keys = [("members", "controller fan-out (members)", "{:.0f}"),
            ("messages_per_epoch", "messages per epoch", "{:.0f}"),
            ("sent_mb_per_epoch", "update bytes sent per epoch (MB)", "{:.3f}"),
            ("wire_mb_per_epoch", "bytes on the wire per epoch, in + out of the nodes (MB)", "{:.3f}"),
            ("python_mb_per_host", "Python RSS per host, peak (MiB)", "{:.0f}"),
            ("jvm_mb_per_host", "executor JVM RSS per host, peak (MiB)", "{:.0f}"),
            ("epoch_s", "time per epoch (s)", "{:.2f}"),
            ("accuracy", "test accuracy", "{:.3f}"),
            ("missing", "updates missing (median of the runs)", "{:.0f}"),
            ("diverged", "replicas diverged", "{:.0f}")]
    print(f"| figure | {VARIANTS[0]} | {args.per_node} per node | ratio |")
    print("|---|---|---|---|")
    for key, label, form in keys:
        one, two = base[key], rows[VARIANTS[1]][key]
        ratio = f"{two / one:.2f}x" if one and key not in ("missing", "diverged", "accuracy") else ""
        print(f"| {label} | {form.format(one)} | {form.format(two)} | {ratio} |")
    return 0 if all(np.isfinite(r["accuracy"]) for found in runs.values() for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
