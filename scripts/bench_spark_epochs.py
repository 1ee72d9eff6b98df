"""Fixed cost per epoch and time from ``fit`` to the first training step, on digits with gradient sharing.

In one ``local-cluster[W,1,1024]`` session (started and warmed up first, not timed), the same network is
trained N epochs twice: as N separate ``fit(rdd)`` calls (the baseline: the user's own epoch loop) and as
one ``fit(rdd, epochs=N)`` call. The fixed cost per epoch is (wall time - the workers' compute) / N, where
the compute of an epoch is the longest worker's sum of step ("fit") and encode times from the training
stats. Time to first step is the first step's start (training stats, wall clock) minus the moment
``fit`` was called, for the first call of each variant. Each figure is the median of --runs runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2,
                        help="executors (local-cluster) and tasks (default 2)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs per variant (default 5)")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant, median reported (default 3)")
    parser.add_argument("--approach", choices=("export", "direct"), default="export")
    return parser.parse_args(argv)


def _compute_seconds(stats: list[dict]) -> float:
    """Per epoch, the longest worker's step + encode time; summed over the epochs."""
    per = defaultdict(float)
    for event in stats:
        if event.get("kind") in ("fit", "encode") and event.get("worker") != "driver":
            per[(event.get("epoch"), event["worker"])] += float(event["end"]) - float(event["start"])
    epochs: dict = defaultdict(float)
    for (epoch, _), seconds in per.items():
        epochs[epoch] = max(epochs[epoch], seconds)
    return sum(epochs.values())


def _first_step(stats: list[dict]) -> float:
    return min(float(e["start"]) for e in stats if e.get("kind") == "fit" and e.get("worker") != "driver")


def _variant(sc, rdd, args: argparse.Namespace, seed: int, one_call: bool) -> dict:
    from bench_spark import _network
    from psrv.encoding import AdaptiveThreshold
    from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration

    master = SharedTrainingMaster(VoidConfiguration(unicast_port=0), batch_size_per_worker=16,
                                  num_workers=args.workers, threshold_algorithm=AdaptiveThreshold(3e-2),
                                  rdd_training_approach=args.approach, collect_training_stats=True)
    spark_net = SparkNetwork(sc, _network(seed), master)
    called = time.time()
    started = time.perf_counter()
    if one_call:
        spark_net.fit(rdd, epochs=args.epochs)
    else:
        for _ in range(args.epochs):
            spark_net.fit(rdd)
    wall = time.perf_counter() - started
    stats = master.training_stats
    compute = _compute_seconds(stats)
    return {"wall": wall, "fixed_per_epoch": (wall - compute) / args.epochs,
            "first_step": _first_step(stats) - called}


def main(argv: list[str] | None = None) -> int:
    import logging

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from bench_spark import _data, _session

    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    train, _ = _data()
    session = _session(f"local-cluster[{args.workers},1,1024]", args.workers)
    try:
        sc = session.sparkContext
        rdd = sc.parallelize(list(train.batches(50)), args.workers).cache()
        rdd.count()
        _variant(sc, rdd, args, 99, one_call=True)  # warm-up: Python workers, numba kernels
        rows = {}
        for name, one_call in (("N separate fit() calls", False), ("one fit(epochs=N)", True)):
            runs = [_variant(sc, rdd, args, seed, one_call) for seed in range(args.runs)]
            rows[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    finally:
        session.stop()
    base = rows["N separate fit() calls"]["fixed_per_epoch"]
    print(f"digits, {args.workers} workers, {args.epochs} epochs, approach {args.approach}, "
          f"median of {args.runs}")
    print("| variant | wall (s) | fixed cost per epoch (s) | vs separate calls | fit -> first step (s) |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['wall']:.2f} | {row['fixed_per_epoch']:.2f} | "
              f"{row['fixed_per_epoch'] / base:.2f}x | {row['first_step']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
