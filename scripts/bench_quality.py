"""How much a step learns: gradient sharing against one process, synchronous and parameter averaging.

Every method trains the same initial module on the same minibatches in the same order (the harness in
scripts/quality/, psrv's real encoder, codec and TorchNetwork for sharing) and this prints, per task,
optimizer, worker count and method: the test accuracy at equal epochs (median over the seeds), its
difference to one process, the steps per worker to reach ``--target`` x one process's final accuracy
(per seed: each seed makes its own data), the bytes sent (total; the first 100 steps and the steady
state per worker and step) and the bitmap messages after the third step. Torch runs on one CPU thread per job.

The defaults (Adam, 3 seeds, 2, 4 and 8 workers, five methods: 156 runs) are meant for a few minutes
per task: a run takes seconds (one process on ``mlp``: 10 s on an idle core) and ``--jobs`` runs one per
core. ``--optimizers adam,sgd`` doubles the runs; ``--tasks`` and ``--methods`` pick fewer.

    .venv/bin/python scripts/bench_quality.py                     # the full table
    .venv/bin/python scripts/bench_quality.py --tasks mlp --workers 2 --seeds 1
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

METHODS = ("one", "sync", "avg", "dl4j", "quantile", "warmup", "exact", "flushend", "flush16", "flush8",
           "mask", "latency", "warmrun")
#: steps of the sparsity warm-up of the "warmup" method (from 10 % of the elements down to 0.9 %)
WARMUP = 50
LABELS = {"one": "one process", "sync": "sync averaging (DDP)", "avg": "param averaging /5",
          "dl4j": "sharing, DL4J settings", "quantile": "sharing, quantile τ",
          "warmup": "sharing, quantile τ + warm-up", "exact": "sharing, no quantization",
          "flushend": "sharing, quantile τ + end flush", "flush16": "sharing, quantile τ + flush/16",
          "flush8": "sharing, quantile τ + flush/8", "mask": "sharing, quantile τ + masking",
          "latency": "sharing, quantile τ, sparsity 1/rounds",
          "warmrun": "sharing, quantile τ + warm-up over the run"}


def _run(job: tuple[str, str, int, int, str, int, int]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from psrv.encoding import ResidualClipping, SampledQuantileThreshold, dl4j_threshold
    from quality import harness, tasks

    name, optimizer, workers, seed, method, delay, jitter = job
    task = tasks.make(name, seed)
    setting = harness.Setting(optimizer=optimizer, workers=workers, seed=seed)
    started = time.perf_counter()
    rounds = task.epochs * (len(task.y_train) // (task.batch_size * workers))
    if method == "one":
        result = harness.one_process(task, harness.Setting(optimizer=optimizer, workers=1, seed=seed))
    elif method == "sync":
        result = harness.synchronous(task, setting)
    elif method == "avg":
        result = harness.parameter_averaging(task, setting)
    else:
        config = {"dl4j": harness.Sharing(dl4j_threshold, lambda: ResidualClipping(5, 5)),
                  "quantile": harness.Sharing(SampledQuantileThreshold, lambda: ResidualClipping(5, 5)),
                  "warmup": harness.Sharing(lambda: SampledQuantileThreshold(warmup=WARMUP),
                                            lambda: ResidualClipping(5, 5)),
                  "exact": harness.Sharing(codec="exact"),
                  "flushend": harness.Sharing(SampledQuantileThreshold, lambda: ResidualClipping(5, 5),
                                              flush_end=1),
                  "flush16": harness.Sharing(lambda: harness.FlushingQuantile(16),
                                             lambda: ResidualClipping(5, 5)),
                  "flush8": harness.Sharing(lambda: harness.FlushingQuantile(8),
                                            lambda: ResidualClipping(5, 5)),
                  "latency": harness.Sharing(lambda: SampledQuantileThreshold.for_steps(rounds),
                                             lambda: ResidualClipping(5, 5)),
                  "warmrun": harness.Sharing(lambda: SampledQuantileThreshold(warmup=rounds),
                                             lambda: ResidualClipping(5, 5)),
                  "mask": harness.Sharing(SampledQuantileThreshold, lambda: ResidualClipping(5, 5),
                                          masking=True)}[method]
        config.delay, config.jitter = delay, jitter
        result = harness.sharing(task, setting, config, LABELS[method])
    return {"job": job, "accuracy": result.accuracy, "curve": result.curve, "steps": result.steps,
            "bytes": result.bytes_total, "dense": result.dense_per_step, "first100": result.bytes_first100,
            "steady": result.steady_per_step, "bitmaps": result.bitmaps_after3,
            "gap": result.replica_gap, "seconds": time.perf_counter() - started}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="mlp,cnn,seq,mlp1m", help="comma-separated, of these four")
    parser.add_argument("--optimizers", default="adam", help="adam (lr 1e-3), sgd (momentum 0.9, 0.01)")
    parser.add_argument("--workers", default="2,4,8", help="worker counts")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per setting (the table shows medians)")
    parser.add_argument("--methods", default="one,sync,exact,dl4j,quantile", help=",".join(METHODS))
    parser.add_argument("--delay", type=int, default=0, help="rounds between an encode and the peers' apply")
    parser.add_argument("--jitter", type=int, default=0, help="up to this many more rounds, per receiver")
    parser.add_argument("--target", type=float, default=0.97,
                        help="steps to target: to this fraction of one process's final accuracy")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes running settings side by side (default: one per core)")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}")
    jobs = []
    for name in args.tasks.split(","):
        for optimizer in args.optimizers.split(","):
            for seed in range(args.seeds):
                if "one" in methods:
                    jobs.append((name, optimizer, 1, seed, "one", 0, 0))
                for workers in (int(w) for w in args.workers.split(",")):
                    jobs += [(name, optimizer, workers, seed, m, args.delay, args.jitter)
                             for m in methods if m != "one"]
    started = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for result in pool.map(_run, jobs):  # each run as it ends, on stderr
            results.append(result)
            print(f"# {result['job']}: accuracy {result['accuracy']:.4f}, {result['bytes']} bytes, "
                  f"{result['seconds']:.1f} s", file=sys.stderr, flush=True)
    print(f"# {len(jobs)} runs in {time.perf_counter() - started:.0f} s; {args.seeds} seed(s), medians; "
          f"delay {args.delay} (+{args.jitter}); target = {args.target} x one process's accuracy")
    print("| task | optimizer | workers | method | accuracy | vs one process | vs sync | steps to target | "
          "bytes total | bytes / dense | first 100 steps / steady, per step | bitmaps after step 3 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.tasks.split(","):
        for optimizer in args.optimizers.split(","):
            one = [r for r in results if r["job"][:2] == (name, optimizer) and r["job"][4] == "one"]
            one_acc = _median([r["accuracy"] for r in one]) if one else None
            # every seed makes its own data set: each seed's target is its own one-process accuracy's
            targets = {r["job"][3]: args.target * r["accuracy"] for r in one}
            rows = [(1, "one")] + [(int(w), m) for w in args.workers.split(",")
                                   for m in methods if m != "one"]
            for workers, method in rows:
                group = [r for r in results
                         if r["job"][:3] == (name, optimizer, workers) and r["job"][4] == method]
                if not group:
                    continue
                acc = _median([r["accuracy"] for r in group])
                reached = [next((s for s, a in r["curve"] if a >= targets[r["job"][3]]), None)
                           for r in group if r["job"][3] in targets]
                # a seed that never reached the target counts as infinitely many steps
                middle = _median([math.inf if s is None else s for s in reached]) if reached else math.inf
                steps = "-" if math.isinf(middle) else f"{middle:.0f}"
                vs = f"{100 * (acc - one_acc):+.1f}" if one_acc is not None else "-"
                sync = [r["accuracy"] for r in results
                        if r["job"][:3] == (name, optimizer, workers) and r["job"][4] == "sync"]
                vs_sync = f"{100 * (acc - _median(sync)):+.1f}" if sync and method != "sync" else "-"
                total = _median([r["bytes"] for r in group])
                dense = group[0]["dense"] * group[0]["steps"] * workers
                ratio = f"{total / dense:.4f}" if total else "-"
                first = _median([r["first100"] / max(1, min(100, r["steps"])) / r["steady"]
                                 for r in group]) if total else None
                print(f"| {name} | {optimizer} | {workers} | {LABELS[method]} | {acc:.3f} | {vs} | "
                      f"{vs_sync} | {steps} | "
                      f"{total / 1e6:.2f} MB | {ratio} | {'-' if first is None else f'{first:.2f}'} | "
                      f"{int(_median([r['bitmaps'] for r in group]))} |")


if __name__ == "__main__":
    main()
