"""Fixed cost per epoch and time from ``fit`` to the first training step, on digits with gradient sharing,
beside TorchDistributor's launch-to-first-step on the same machine in the same run.

In one ``local-cluster[W,1,1024]`` session (started and warmed up first, not timed), the same network is
trained N epochs three ways, each --runs times, alternating:

- ``separate``: N separate ``fit(rdd)`` calls (the user's own epoch loop; each exports nothing new but
  starts its own controller, keys and job);
- ``per-epoch``: one ``fit(rdd, epochs=N)`` with the old per-epoch setup (a controller, keys and joins per
  epoch: the master's ``controller_for_call`` replaced by one that keeps nothing);
- ``kept``: one ``fit(rdd, epochs=N)`` as it runs now (one controller for the call; each epoch's job
  joins it).

Figures, from the training stats (wall clock): the fixed cost per epoch is (wall time - the workers'
compute) / N, where an epoch's compute is the longest worker's sum of step ("fit") and encode times; the
fixed cost per later epoch is the same over epochs 2..N only (from the end of epoch 1's job to the end of
``fit``); fit -> first step is the first step's start minus the moment ``fit`` was called. TorchDistributor
(``local_mode=True, num_processes=2, use_gpu=False``) runs a tiny train function that returns the time of
its first optimizer step; its figure is that time minus the moment ``run`` was called. A Spark job of W
empty tasks is timed beside them: the floor under any design with one job per epoch. Medians of --runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import time
from collections import defaultdict

from bench_spark import digits_data, digits_network, spark_session
from psrv.encoding import AdaptiveThreshold
from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration

VARIANTS = {
    "separate": "N separate fit() calls",
    "per-epoch": "fit(epochs=N), controller per epoch (before)",
    "kept": "fit(epochs=N), controller kept (now)",
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2,
                        help="executors (local-cluster) and tasks (default 2)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs per variant (default 5)")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant, median reported (default 3)")
    parser.add_argument("--approach", choices=("export", "direct"), default="export")
    parser.add_argument("--no-torch-distributor", action="store_true",
                        help="skip TorchDistributor's launch-to-first-step")
    return parser.parse_args(argv)


def _compute_by_epoch(stats: list[dict]) -> dict:
    """Per epoch, the longest worker's step + encode time."""
    per: dict = defaultdict(float)
    for event in stats:
        if event.get("kind") in ("fit", "encode") and event.get("worker") != "driver":
            per[(event.get("epoch"), event["worker"])] += float(event["end"]) - float(event["start"])
    epochs: dict = defaultdict(float)
    for (epoch, _), seconds in per.items():
        epochs[epoch] = max(epochs[epoch], seconds)
    return epochs


def _first_step(stats: list[dict]) -> float:
    return min(float(e["start"]) for e in stats if e.get("kind") == "fit" and e.get("worker") != "driver")


def _variant(sc, rdd, args: argparse.Namespace, seed: int, variant: str) -> dict:
    master = SharedTrainingMaster(VoidConfiguration(unicast_port=0), batch_size_per_worker=16,
                                  num_workers=args.workers, threshold_algorithm=AdaptiveThreshold(3e-2),
                                  rdd_training_approach=args.approach, collect_training_stats=True,
                                  progress=False)
    if variant == "per-epoch":  # the old setup: no controller kept for the call, one per epoch's job
        master.controller_for_call = lambda spark_context, network: contextlib.nullcontext()
    spark_net = SparkNetwork(sc, digits_network(seed), master)
    called = time.time()
    if variant == "separate":
        for _ in range(args.epochs):
            spark_net.fit(rdd)
    else:
        spark_net.fit(rdd, epochs=args.epochs)
    ended = time.time()
    stats = master.training_stats
    compute = _compute_by_epoch(stats)
    jobs = sorted((e for e in stats if e.get("kind") == "training_job"), key=lambda e: e["start"])
    later_compute = sum(seconds for epoch, seconds in compute.items() if epoch != min(compute))
    later = (ended - float(jobs[0]["end"]) - later_compute) / max(1, args.epochs - 1)
    return {"wall": ended - called, "fixed_per_epoch": (ended - called - sum(compute.values())) / args.epochs,
            "fixed_later_epoch": later, "first_step": _first_step(stats) - called,
            "controllers": getattr(master, "controller_starts", float("nan"))}


def _bare_job(sc, workers: int) -> float:
    """Seconds of a Spark job of ``workers`` tasks that do nothing: the floor under any job per epoch."""
    started = time.perf_counter()
    sc.parallelize(range(workers), workers).mapPartitions(lambda items: [sum(items)]).collect()
    return time.perf_counter() - started


def _torch_train(steps: int = 3) -> float:
    """Runs in each TorchDistributor process: a few steps of a tiny DDP model; the first step's end time."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = 0.0
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.randn(16, 64)), torch.randint(0, 10, (16,)))
        loss.backward()
        optimizer.step()
        if step == 0:
            first = time.time()
    dist.destroy_process_group()
    return first


def _torch_distributor(runs: int) -> list[float] | str:
    """Launch-to-first-step of TorchDistributor, or why it could not run."""
    try:
        import torch  # noqa: F401
        from pyspark.ml.torch.distributor import TorchDistributor
    except ImportError as exc:
        return f"not measured: {exc}"
    seconds = []
    for _ in range(runs):
        launched = time.time()
        try:
            first = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(_torch_train)
        except Exception as exc:  # noqa: BLE001 - reported, the rest of the benchmark stands
            return f"not measured: TorchDistributor failed: {type(exc).__name__}: {str(exc)[:300]}"
        seconds.append(float(first) - launched)
    return seconds


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    train, _ = digits_data()
    session = spark_session(f"local-cluster[{args.workers},1,1024]", args.workers)
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    try:
        sc = session.sparkContext
        rdd = sc.parallelize(list(train.batches(50)), args.workers).cache()
        rdd.count()
        _variant(sc, rdd, args, 99, "kept")  # warm-up: Python workers, numba kernels
        bare = []
        for seed in range(args.runs):  # alternating, so that a slow spell of the machine hits all alike
            for name in VARIANTS:
                runs[name].append(_variant(sc, rdd, args, seed, name))
            bare.extend(_bare_job(sc, args.workers) for _ in range(3))
        distributor = "skipped (--no-torch-distributor)" if args.no_torch_distributor \
            else _torch_distributor(args.runs)
    finally:
        session.stop()
    rows = {name: {k: statistics.median(r[k] for r in found) for k in found[0]}
            for name, found in runs.items()}
    base = rows["per-epoch"]
    print(f"digits, {args.workers} workers, {args.epochs} epochs, approach {args.approach}, "
          f"median of {args.runs} runs")
    print("| variant | wall (s) | fixed cost per epoch (s) | per later epoch (s) | vs per-epoch controller "
          "| fit -> first step (s) | controllers started |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {VARIANTS[name]} | {row['wall']:.2f} | {row['fixed_per_epoch']:.2f} | "
              f"{row['fixed_later_epoch']:.2f} | {row['fixed_per_epoch'] / base['fixed_per_epoch']:.2f}x | "
              f"{row['first_step']:.2f} | {row['controllers']:.0f} |")
    print(f"| a Spark job of {args.workers} empty tasks (the floor under one job per epoch) | "
          f"{statistics.median(bare):.2f} | | | | | |")
    if isinstance(distributor, list):
        print(f"| TorchDistributor(local_mode=True, num_processes=2), launch -> first step | | | | | "
              f"{statistics.median(distributor):.2f} | |")
    else:
        print(f"TorchDistributor: {distributor}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
