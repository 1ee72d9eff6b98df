"""Gradient sharing vs parameter averaging vs one process: test accuracy and time on the same task for the
same epochs.

scikit-learn's digits (75% train, 25% test), the same network (Dense(256, relu) -> softmax, Adam 1e-2,
the same seed) trained for --epochs epochs three ways in one run: ``Network.fit`` in this process
(the baseline), ``SharedTrainingMaster`` and ``ParameterAveragingTrainingMaster`` (averaging every
--averaging-frequency minibatches, updater state averaged too) on one Spark session
(``local-cluster[W,1,1024]``, W = --workers), each ``fit(rdd, epochs=N)`` with --batch-size examples per
worker minibatch (the one-process baseline uses the same minibatch size). Times are the wall time of the
training call (the Spark session's start excluded, the per-fit export and controller included); every
figure is the median of --runs runs with seeds 0, 1, 2 ...; the ratios are against one process in the
same run. The load average is printed: the machine may be shared, so compare ratios, not seconds.

    .venv/bin/python scripts/bench_masters.py --epochs 5 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_spark import digits_data, digits_network, spark_session  # noqa: E402
from psrv.encoding import AdaptiveThreshold  # noqa: E402
from psrv.spark import (  # noqa: E402
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkNetwork,
    VoidConfiguration,
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=5, help="epochs of every variant (default 5)")
    p.add_argument("--runs", type=int, default=3, help="runs per variant, median reported (default 3)")
    p.add_argument("--workers", type=int, default=2, help="Spark workers (default 2)")
    p.add_argument("--batch-size", type=int, default=16, help="examples per minibatch (default 16)")
    p.add_argument("--averaging-frequency", type=int, default=5,
                   help="parameter averaging: minibatches between averagings (default 5)")
    p.add_argument("--master-template", default="local-cluster[{w},1,1024]",
                   help="Spark master, {w} the workers (default local-cluster[{w},1,1024])")
    return p.parse_args(argv)


def _one_process(args: argparse.Namespace, train, test, seed: int) -> dict:
    network = digits_network(seed)
    started = time.perf_counter()
    network.fit(train, epochs=args.epochs, batch_size=args.batch_size)
    return {"seconds": time.perf_counter() - started, "accuracy": network.evaluate(test).accuracy()}


def _on_spark(args: argparse.Namespace, sc, master, rdd, test, seed: int) -> dict:
    network = digits_network(seed)
    spark_net = SparkNetwork(sc, network, master)
    started = time.perf_counter()
    spark_net.fit(rdd, epochs=args.epochs)
    seconds = time.perf_counter() - started
    spark_net.close()
    return {"seconds": seconds, "accuracy": network.evaluate(test).accuracy()}


def _sharing(args: argparse.Namespace) -> SharedTrainingMaster:
    return SharedTrainingMaster(VoidConfiguration(unicast_port=0, mesh_build_mode="plain"),
                                batch_size_per_worker=args.batch_size, num_workers=args.workers,
                                threshold_algorithm=AdaptiveThreshold(3e-2), progress=False)


def _averaging(args: argparse.Namespace) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(batch_size_per_worker=args.batch_size,
                                            averaging_frequency=args.averaging_frequency, save_updater=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    train, test = digits_data()
    master_url = args.master_template.format(w=args.workers)
    session = spark_session(master_url, args.workers)
    sc = session.sparkContext
    rdd = sc.parallelize(list(train.batches(50)), args.workers).cache()
    rdd.count()
    variants = {"one process (Network.fit)": lambda seed: _one_process(args, train, test, seed),
                "gradient sharing": lambda seed: _on_spark(args, sc, _sharing(args), rdd, test, seed),
                "parameter averaging": lambda seed: _on_spark(args, sc, _averaging(args), rdd, test, seed)}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    loads = [os.getloadavg()[0]]
    for seed in range(args.runs):  # interleaved, so a change in the machine's load hits every variant
        for name, variant in variants.items():
            runs[name].append(variant(seed))
            loads.append(os.getloadavg()[0])
            print(f"  seed {seed}: {name}: {runs[name][-1]}", flush=True)
    session.stop()
    base = statistics.median(r["seconds"] for r in runs["one process (Network.fit)"])
    print(f"\ndigits, {args.epochs} epochs, batch {args.batch_size}, {master_url}, "
          f"median of {args.runs} runs; load average (1 min) {min(loads):.1f}-{max(loads):.1f} in the run")
    print("| variant | test accuracy | seconds | time vs one process |")
    print("|---|---:|---:|---:|")
    for name, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        accuracy = statistics.median(r["accuracy"] for r in results)
        print(f"| {name} | {accuracy:.4f} | {seconds:.2f} | {seconds / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
