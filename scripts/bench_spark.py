"""Time to reach a test accuracy on scikit-learn's digits: gradient sharing on Spark vs one process.

For each worker count (default 1 and 2) a fresh ``local-cluster[W,1,1024]`` Spark session is
started (real executor processes); the same network (Dense(256, relu) -> softmax, Adam 1e-2) is
trained one epoch per ``fit`` with SharedTrainingMaster until its test accuracy reaches the target
(default 0.95) or --max-epochs pass. Beside it, in the same run, single-process training of the
same network (``Network.fit``, same batch size) is timed to the same target. Times exclude the
Spark session start-up; each figure is the median of --runs runs. Bytes per step are the encoded
update bytes workers sent divided by the steps, beside the dense parameter vector's size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="one run per configuration and a 0.90 target (a smoke run, noisier figures)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--target", type=float, default=None, help="test accuracy to reach (default 0.95)")
    parser.add_argument("--runs", type=int, default=None, help="runs per configuration, median reported "
                        "(default 3; --quick: 1)")
    parser.add_argument("--max-epochs", type=int, default=30,
                        help="give up after this many epochs (default 30)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per minibatch (default 16)")
    parser.add_argument("--mesh", choices=("plain", "mesh"), default="plain",
                        help="mesh mode (default plain)")
    parser.add_argument("--approach", choices=("export", "direct"), default="direct",
                        help="rdd_training_approach (default direct)")
    parser.add_argument("--master-template", default="local-cluster[{w},1,1024]",
                        help="Spark master per worker count, {w} replaced "
                        "(default local-cluster[{w},1,1024])")
    args = parser.parse_args(argv)
    args.target = args.target if args.target is not None else (0.90 if args.quick else 0.95)
    args.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    return args


def _data(seed: int = 42):
    from psrv.nn.data import DataSet
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    data = DataSet.from_class_indices(features, digits.target.astype(np.int64), 10)
    return data.split(0.75, seed=seed)


def _network(seed: int):
    from psrv.nn import Adam, Dense, Network, Output

    layers = [Dense(256, activation="relu"), Output(10)]
    return Network(layers, input_shape=(64,), updater=Adam(1e-2), seed=seed)


def _single_process(args: argparse.Namespace, train, test, seed: int) -> dict:
    network = _network(seed)
    started = time.perf_counter()
    for epoch in range(1, args.max_epochs + 1):
        network.fit(train, epochs=1, batch_size=args.batch_size)
        if network.evaluate(test).accuracy() >= args.target:
            return {"seconds": time.perf_counter() - started, "epochs": epoch, "reached": True}
    return {"seconds": time.perf_counter() - started, "epochs": args.max_epochs, "reached": False}


def _gradient_sharing(args: argparse.Namespace, sc, workers: int, train, test, seed: int) -> dict:
    from psrv.encoding import AdaptiveThreshold
    from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration

    network = _network(seed)
    master = SharedTrainingMaster(VoidConfiguration(unicast_port=0, mesh_build_mode=args.mesh),
                                  batch_size_per_worker=args.batch_size, num_workers=workers,
                                  threshold_algorithm=AdaptiveThreshold(3e-2),
                                  rdd_training_approach=args.approach)
    spark_net = SparkNetwork(sc, network, master)
    rdd = sc.parallelize(list(train.batches(50)), workers).cache()
    rdd.count()
    steps = sent = 0
    started = time.perf_counter()
    reached, epochs = False, 0
    while epochs < args.max_epochs:
        epochs += 1
        spark_net.fit(rdd)
        steps += master.last_fit["steps"]
        sent += master.last_fit["bytes_sent"]
        if network.evaluate(test).accuracy() >= args.target:
            reached = True
            break
    seconds = time.perf_counter() - started
    rdd.unpersist()
    return {"seconds": seconds, "epochs": epochs, "reached": reached,
            "bytes_per_step": sent / max(1, steps), "dense_bytes": network.num_params * 4}


def _session(master: str, workers: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_HOME", os.path.dirname(os.path.abspath(pyspark.__file__)))
    session = (SparkSession.builder.master(master).appName("psrv-bench-spark")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.default.parallelism", str(workers)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + 120
    while session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < workers \
            and master.startswith("local-cluster") and time.monotonic() < deadline:
        time.sleep(0.2)
    return session


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    import logging

    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    train, test = _data()
    worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    print(f"digits: {train.num_examples} train / {test.num_examples} test; target test accuracy "
          f"{args.target}; batch {args.batch_size}; median of {args.runs} run(s)")
    baseline = [_single_process(args, train, test, seed) for seed in range(args.runs)]
    rows = [("single process", _median(baseline, "seconds"), _median(baseline, "epochs"),
             all(r["reached"] for r in baseline), None, None)]
    for workers in worker_counts:
        session = _session(args.master_template.format(w=workers), workers)
        try:
            # warm-up: numba kernels and Python workers on the executors
            _gradient_sharing(args, session.sparkContext, workers, train, test, 99)
            runs = [_gradient_sharing(args, session.sparkContext, workers, train, test, seed)
                    for seed in range(args.runs)]
        finally:
            session.stop()
        rows.append((f"gradient sharing, {workers} worker(s)", _median(runs, "seconds"),
                     _median(runs, "epochs"), all(r["reached"] for r in runs),
                     _median(runs, "bytes_per_step"), runs[0]["dense_bytes"]))
    base = rows[0][1]
    print(f"\n| configuration | time to {args.target:.2f} (s) | vs single process | epochs | bytes/step "
          "(dense) |")
    print("|---|---|---|---|---|")
    for name, seconds, epochs, reached, per_step, dense in rows:
        mark = "" if reached else " (not reached)"
        cost = "" if per_step is None else f"{per_step:,.0f} ({dense:,})"
        print(f"| {name} | {seconds:.2f}{mark} | {seconds / base:.1f}x | {epochs:g} | {cost} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
