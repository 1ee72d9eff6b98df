"""How much a step learns: gradient sharing against one process, synchronous and parameter averaging.

Every method trains the same initial module on the same minibatches in the same order (the harness in
scripts/quality/, psrv's real encoder, codec and TorchNetwork for sharing) and this prints, per task,
optimizer, worker count and method: the test accuracy at equal epochs (median over the seeds), its
difference to one process, the steps per worker to reach ``--target`` x one process's final accuracy
(per seed: each seed makes its own data; read linearly between the evaluations), those steps against
synchronous averaging's (the median of the per-seed ratios), the bytes sent (total, in the packed form
updates travel in, and as the encoder's sparse or bitmap messages would take; the first 100 steps and
the steady state per worker and step) and the bitmap messages the encoder made after the third step. Torch
runs on one CPU thread per job. Where the default ran beside one process, a second table checks it
against the aims (within 1 point of one process and of synchronous averaging at 2 and 4 workers, 2 at
8; at most 1/100 of a dense exchange's bytes; the first 100 steps at most twice the steady state per
step; no bitmap after step 3) and names what missed.

The defaults (Adam, 3 seeds, 2, 4 and 8 workers, five methods: 156 runs) are meant for a few minutes
per task: a run takes seconds (one process on ``mlp``: 10 s on an idle core) and ``--jobs`` runs one per
core. ``--optimizers adam,sgd`` doubles the runs; ``--tasks`` and ``--methods`` pick fewer. ``--save``
keeps every run (its accuracy curve included) so that ``--load`` prints the tables again, at another
``--target`` or with ``--targets`` (steps against synchronous averaging's at several targets at once).

Learning rates: each optimizer's own by default (Adam 1e-3, SGD 0.01, RMSprop 1e-4). ``--lr-scale F``
runs every method at F times it, one process included (its rows are named "lr x F", so they are compared
only with their like); a method ``sync@K`` is synchronous averaging at K times it, beside one process at
the optimizer's own (``--methods one,sync@4,sync@8,sync@16``: the best synchronous averaging can do at
equal epochs, over a grid of learning rates).

    .venv/bin/python scripts/bench_quality.py                     # the full table
    .venv/bin/python scripts/bench_quality.py --tasks mlp --workers 2 --seeds 1
    .venv/bin/python scripts/bench_quality.py --tasks mlp1m --epochs 4 --save runs.json
    .venv/bin/python scripts/bench_quality.py --load runs.json --targets 0.8,0.9,0.97
    .venv/bin/python scripts/bench_quality.py --tasks cnn --workers 8 --methods one,sync@8,sync@16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from quality.methods import (  # noqa: E402  (scripts/ is not a package)
    DEFAULT_SPARSITY,
    LOCAL_STEPS,
    METHODS,
    PERIODS,
    SYNC_AT,
    WARMUP,
    label,
    sync_factor,
)
from quality.report import (  # noqa: E402
    aims_heading,
    aims_table,
    ratio_table,
    table,
)

#: what every update carried on the wire beside its payload on a model of 788 parameters with protocol 2
#: (its msgpack header fields and its share of the heartbeats; ``bench_wire_overhead.py --params 788``),
#: what the ``periodK`` methods were measured against; protocol 3's compact frame takes about 6
WIRE_FIXED_BYTES = 61


def period_threshold(period: int, sparsity: float) -> Any:
    """The default threshold for one message every ``period`` rounds: ``period`` times the default's share
    of the elements, within a byte budget that keeps each round's share of an update on the wire (its
    payload plus WIRE_FIXED_BYTES) at 1 % of a dense update, with no floor under it."""
    from psrv.encoding import SampledQuantileThreshold

    class WireBudget(SampledQuantileThreshold):
        def budget_elements(self, n: int) -> int | None:
            self.byte_budget = max(1e-4, min(1.0, (0.01 * period * 4 * n - WIRE_FIXED_BYTES) / (4 * n)))
            return super().budget_elements(n)

        def _budget_bounds(self, m: int, n: int, sparsity: float) -> tuple[int, int]:
            return max(1, m * self.budget_elements(n) // n), 1  # the budget alone: no floor

    return WireBudget(sparsity=min(1.0, sparsity * period), byte_budget=0.01)


def auto_local_steps(task: Any, setting: Any) -> int:
    """What ``SharedTrainingMaster(local_steps="auto")`` takes for this task's model, optimizer and
    minibatch: the product's rule (psrv.spark.driver.stepping.choose_local_steps), asked of the network."""
    from psrv.spark.driver.stepping import AUTO, choose_local_steps
    from quality import harness

    network = harness.network(harness.initial_module(task, setting), task, setting)
    return choose_local_steps(AUTO, network, task.batch_size, setting.workers)[0]  # all side by side


def _run(job: tuple[Any, ...]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from psrv.encoding import (
        ResidualClipping,
        SampledQuantileThreshold,
        dl4j_threshold,
        shared_training_threshold,
    )
    from quality import harness, tasks

    name, optimizer, workers, seed, method, delay, jitter, epochs = job[:8]
    sparsity = job[8] if len(job) > 8 and job[8] else DEFAULT_SPARSITY
    interleave = bool(job[9]) if len(job) > 9 else False
    lr = harness.DEFAULT_LR[optimizer] * (job[10] if len(job) > 10 and job[10] else 1.0)
    task = tasks.make(name, seed, **({"epochs": epochs} if epochs else {}))
    worker_batch = job[11] if len(job) > 11 else 0
    if worker_batch and method != "one":  # one process keeps the task's batch: the reference
        task.batch_size = worker_batch
    setting = harness.Setting(optimizer=optimizer, workers=workers, seed=seed, lr=lr)
    started = time.perf_counter()
    rounds = task.epochs * (len(task.y_train) // (task.batch_size * workers))
    if method == "one":
        result = harness.one_process(task, harness.Setting(optimizer=optimizer, workers=1, seed=seed, lr=lr))
    elif method == "sync":
        result = harness.synchronous(task, setting)
    elif method in ("syncsqrt", "synclin"):  # the N-fold batch with the learning rate scaled up for it
        setting.lr = lr * (math.sqrt(workers) if method == "syncsqrt" else workers)
        result = harness.synchronous(task, setting)
    elif method.startswith(SYNC_AT):
        setting.lr = lr * sync_factor(method)
        result = harness.synchronous(task, setting)
    elif method == "avg":
        result = harness.parameter_averaging(task, setting)
    elif method in ("gradients", "gradlin"):  # the gradients shared, every replica's optimizer stepping
        setting.lr = lr * (workers if method == "gradlin" else 1)
        gradients = harness.Sharing(lambda: shared_training_threshold(sparsity),
                                    lambda: ResidualClipping(5, 5))
        result = harness.compressed_gradients(task, setting, gradients, label(method))
    else:
        onestep = harness.Sharing(lambda: shared_training_threshold(sparsity),
                                  lambda: ResidualClipping(5, 5), own_point=True, scale_momentum=True)
        # the shipped default's local_steps="auto", decided by the product's own rule for this task's model
        default = dataclasses.replace(onestep, local_steps=auto_local_steps(task, setting)) \
            if method in ("default", "zerostart", "exactdefault") else onestep
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
                                          masking=True),
                  "ownpoint": harness.Sharing(dl4j_threshold, lambda: ResidualClipping(5, 5), own_point=True),
                  "dl4jown": harness.Sharing(dl4j_threshold, lambda: ResidualClipping(5, 5), own_point=True,
                                             scale_momentum=True),
                  "quant3": harness.Sharing(lambda: SampledQuantileThreshold(sparsity=0.03),
                                            lambda: ResidualClipping(5, 5), own_point=True),
                  "default": default,
                  "onestep": onestep,
                  "zerostart": dataclasses.replace(default, square_start=False),
                  # what the default's stepping gives with every update whole: no threshold, no residual
                  "exactdefault": dataclasses.replace(default, codec="exact", threshold=None,
                                                      post_processor=None, own_point=False),
                  "quantown": harness.Sharing(SampledQuantileThreshold, lambda: ResidualClipping(5, 5),
                                              own_point=True),
                  **{f"local{k}": dataclasses.replace(onestep, local_steps=k) for k in LOCAL_STEPS},
                  **{f"period{k}": dataclasses.replace(
                      default, message_period=k,
                      threshold=lambda k=k: period_threshold(k, sparsity)) for k in PERIODS}}[method]
        config.delay, config.jitter, config.interleave = delay, jitter, interleave
        result = harness.sharing(task, setting, config, label(method))
    return {"job": job, "accuracy": result.accuracy, "curve": result.curve, "steps": result.steps,
            "bytes": result.bytes_total, "unpacked": result.bytes_unpacked or result.bytes_total,
            "dense": result.dense_per_step, "first100": result.bytes_first100,
            "steady": result.steady_per_step, "bitmaps": result.bitmaps_after3,
            "gap": result.replica_gap, "seconds": time.perf_counter() - started}



def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="mlp,cnn,seq,mlp1m", help="comma-separated, of these four")
    parser.add_argument("--optimizers", default="adam",
                        help="comma-separated: adam (lr 1e-3), sgd (momentum 0.9, lr 0.01), rmsprop "
                        "(momentum 0.9, lr 1e-4)")
    parser.add_argument("--workers", default="2,4,8", help="worker counts")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per setting (the table shows medians)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the seeds are first-seed, first-seed + 1, ... (to run seeds in parts)")
    parser.add_argument("--methods", default="one,sync,exact,dl4j,default",
                        help=",".join(METHODS)
                        + f", {SYNC_AT}K (synchronous averaging at K x the learning rate)")
    parser.add_argument("--sparsity", type=float, default=DEFAULT_SPARSITY,
                        help=f"the fraction of the elements the default method's quantile τ sends "
                        f"(default {DEFAULT_SPARSITY}, the shipped default's)")
    parser.add_argument("--epochs", type=int, default=0,
                        help="epochs of every task (default: each task's own, see README)")
    parser.add_argument("--delay", type=int, default=0, help="rounds between an encode and the peers' apply")
    parser.add_argument("--jitter", type=int, default=0, help="up to this many more rounds, per receiver")
    parser.add_argument("--lr-scale", type=float, default=1.0, metavar="F",
                        help="every method, one process included, at F x the optimizer's learning rate "
                        "(default 1: Adam 1e-3, SGD 0.01, RMSprop 1e-4); rows are named 'lr x F'")
    parser.add_argument("--worker-batch", type=int, default=0, metavar="B",
                        help="every method but one process trains on minibatches of B rows per worker "
                        "(default: the task's own, 32); with B = 32 / N at N workers the workers together "
                        "take one process's batch per round, as with DDP's batch split across the "
                        "workers; rows are named 'batch B per worker'")
    parser.add_argument("--interleave", action="store_true",
                        help="sharing's workers step one after the other within a round, each after the "
                        "round's earlier workers' updates arrived (with --delay 0), as workers taking "
                        "turns on few cores do; by default every worker of a round steps from the "
                        "round's common point (lock-step)")
    parser.add_argument("--target", type=float, default=0.97,
                        help="steps to target: to this fraction of one process's final accuracy")
    parser.add_argument("--targets", metavar="FRACTIONS",
                        help="also print steps to target against synchronous averaging's at each of these "
                        "comma-separated fractions of one process's accuracy (e.g. 0.8,0.9,0.95)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes running settings side by side (default: one per core)")
    parser.add_argument("--save", metavar="FILE", help="also write every run's results (curves included) "
                        "to this JSON file")
    parser.add_argument("--load", metavar="FILES", help="run nothing: print the table of the runs saved "
                        "in these comma-separated --save files (at this --target)")
    args = parser.parse_args(argv)
    if args.load:
        results = []
        for path in args.load.split(","):
            with open(path) as f:
                results += json.load(f)["runs"]
        print(f"# {len(results)} runs from {args.load}; medians over the seeds; "
              f"target = {args.target} x one process's accuracy")
        _print_tables(results, args)
        return
    methods = [m for m in args.methods.split(",") if m]
    try:
        unknown = sorted(m for m in set(methods) - set(METHODS) if sync_factor(m) is None)
    except ValueError as exc:
        parser.error(f"--methods: {exc}")
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}, {SYNC_AT}K")
    if not (math.isfinite(args.lr_scale) and args.lr_scale > 0):
        parser.error(f"--lr-scale: expected a positive number, got {args.lr_scale}")
    from psrv.encoding import SampledQuantileThreshold

    try:  # refused here, before any run, as the threshold refuses it
        SampledQuantileThreshold(sparsity=args.sparsity)
    except ValueError as exc:
        parser.error(f"--sparsity: {exc}")
    sparsity = 0.0 if args.sparsity == DEFAULT_SPARSITY else args.sparsity  # the default's runs keep its key
    lr_scale = 0.0 if args.lr_scale == 1 else args.lr_scale  # likewise
    if args.worker_batch < 0:
        parser.error(f"--worker-batch: expected a positive number of rows, got {args.worker_batch}")
    jobs = []
    for name in args.tasks.split(","):
        for optimizer in args.optimizers.split(","):
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                if "one" in methods:
                    jobs.append((name, optimizer, 1, seed, "one", 0, 0, args.epochs, sparsity,
                                 args.interleave, lr_scale, args.worker_batch))
                for workers in (int(w) for w in args.workers.split(",")):
                    jobs += [(name, optimizer, workers, seed, m, args.delay, args.jitter, args.epochs,
                              sparsity, args.interleave, lr_scale, args.worker_batch)
                             for m in methods if m != "one"]
    started = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for result in pool.map(_run, jobs):  # each run as it ends, on stderr
            results.append(result)
            print(f"# {result['job']}: accuracy {result['accuracy']:.4f}, {result['bytes']} bytes, "
                  f"{result['seconds']:.1f} s", file=sys.stderr, flush=True)
            if args.save:  # after every run, so an interrupted benchmark keeps what it measured
                with open(args.save, "w") as f:
                    json.dump({"argv": sys.argv[1:] if argv is None else argv, "runs": results}, f)
    print(f"# {len(jobs)} runs in {time.perf_counter() - started:.0f} s; {args.seeds} seed(s), medians; "
          f"delay {args.delay} (+{args.jitter}); target = {args.target} x one process's accuracy")
    _print_tables(results, args)


def _print_tables(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print("\n".join(table(results, args.target)))
    aims = aims_table(results)
    if len(aims) > 2:
        print(f"\n# {aims_heading()}")
        print("\n".join(aims))
    if args.targets:
        print("\n# steps to target / synchronous averaging's, medians of the per-seed ratios")
        print("\n".join(ratio_table(results, [float(f) for f in args.targets.split(",")])))


if __name__ == "__main__":
    main()
