"""Does the real Spark path learn what the quality harness says it learns? The same task, module, seed,
optimizer and epochs, trained three ways in one run:

* one process (the harness's), the reference;
* the harness's simulation of gradient sharing with the default settings (tau at the 3 % quantile of
  each residual, steps from the worker's own point, momentum ** workers) and with DL4J's
  (``dl4j_threshold()``, ``step_from="shared"``, the optimizer as given);
* a real ``TorchEstimator`` fit on Spark (``local-cluster[W,1,1024]`` by default: W executor processes,
  a controller on the driver, real ZeroMQ sockets), with each of the two;
* with ``--ways default,dl4j,given``, also psrv's defaults with the optimizer as given
  (``scale_momentum=False``), in the harness and on Spark;
* with ``--local-steps auto,1,2``, the default way at each of these optimizer steps a message (on Spark
  ``SharedTrainingMaster(local_steps=K)``, in the harness the ``localK`` method, ``onestep`` for 1);
  ``auto``, the master's default, is the default way as shipped; one process stays the reference.

Spark deals and shuffles the rows its own way, so a seed's Spark run sees another minibatch order than
its harness run: compare medians over the seeds, not single runs. Prints one table row per method with
the test accuracy per seed, the median, the points against one process, and the bytes sent against a
dense exchange (Spark: every message of every epoch, as ``last_fit`` counts them after each), and for
the Spark rows what crossed the wire against it (``last_fit["wire_bytes"]``: every frame the workers'
nodes sent, heartbeats, join and leave included, and of it the heartbeats'; the bytes aim checks all
that crossed the wire where that was counted, the payloads elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality.methods import LOCAL_STEPS  # noqa: E402  (scripts/ is not a package)
from quality.report import aims_verdict, seed_by_seed  # noqa: E402

#: the ways a fit can share: psrv's defaults, DL4J's, and psrv's defaults with the optimizer as given
WAYS = ("default", "dl4j", "given")
#: each way's harness method (bench_quality.py's)
HARNESS_METHOD = {"default": "default", "dl4j": "dl4j", "given": "quant3"}


def _spark(master: str, workers: int) -> Any:
    from bench_spark import spark_session

    return spark_session(master, workers)


def _spark_fit(spark: Any, task: Any, seed: int, workers: int, way: str,
               per_node: int = 1, optimizer: str = "adam", worker_batch: int = 0,
               local_steps: int | str = "auto") -> dict[str, Any]:
    """One TorchEstimator fit of the task's module (the harness's initial weights) on Spark: ``workers``
    trainers in all, ``per_node`` of them in each task (``workers // per_node`` tasks), each on
    minibatches of ``worker_batch`` rows (0: the task's own), ``local_steps`` optimizer steps a message."""
    import numpy as np
    import torch
    from psrv.encoding import dl4j_threshold
    from psrv.spark import SharedTrainingMaster
    from psrv.spark.ml import TorchEstimator
    from quality import harness

    setting = harness.Setting(optimizer=optimizer, seed=seed)
    module = harness.initial_module(task, setting)
    rows = [(x.reshape(-1).tolist(), int(y)) for x, y in zip(task.x_train, task.y_train, strict=True)]
    tasks = workers // per_node
    frame = spark.createDataFrame(rows, ["features", "label"]).repartition(tasks).cache()
    frame.count()
    settings = {"default": {}, "given": {"scale_momentum": False},
                "dl4j": {"threshold_algorithm": dl4j_threshold(), "step_from": "shared",
                         "scale_momentum": False}}
    batch = worker_batch or task.batch_size
    master = SharedTrainingMaster(batch_size_per_worker=batch, num_workers=tasks,
                                  workers_per_node=per_node, progress=False, local_steps=local_steps,
                                  **settings[way])
    epochs: list[dict[str, Any]] = []  # last_fit is one epoch's: keep every epoch's

    def keep_epoch(epoch: int, metrics: dict[str, float]) -> bool:
        epochs.append(dict(master.last_fit))
        return False

    started = time.perf_counter()
    model = TorchEstimator(module, torch.nn.CrossEntropyLoss(), input_shape=task.input_shape,
                           epochs=task.epochs, seed=seed, batch_size=batch,
                           optimizer=_optimizer(optimizer),
                           training_master=master, callbacks=[keep_epoch]).fit(frame)
    seconds = time.perf_counter() - started
    frame.unpersist()
    if len(epochs) != task.epochs:
        raise RuntimeError(f"the fit ran {len(epochs)} epochs where {task.epochs} were asked for")
    predicted = np.asarray(model.network.predict(task.x_test))
    return {"accuracy": float(np.mean(predicted == task.y_test)), "seconds": seconds,
            "bytes": sum(int(e["bytes_sent"]) for e in epochs),
            "dense": sum(int(e["dense_bytes"]) for e in epochs),
            "wire": sum(int(e["wire_bytes"]) for e in epochs),
            "beats": sum(int(e["heartbeat_bytes"]) for e in epochs),
            "steps": sum(int(e["steps"]) for e in epochs),
            "step_from": [e.get("step_from") for e in epochs],
            "local_steps_used": [e.get("local_steps") for e in epochs],
            "momentum": [e.get("momentum") for e in epochs],
            "diverged": sum(int(e.get("replicas_diverged", 0)) for e in epochs)}


def _optimizer(name: str) -> Any:
    """The harness's optimizer (``harness.Setting.make_optimizer``) as a function of this script, which
    travels to the executors by value (the harness's module does not: only its learning rate does)."""
    import torch
    from quality.harness import DEFAULT_LR

    lr = DEFAULT_LR[name]
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "rmsprop":
        return lambda params: torch.optim.RMSprop(params, lr=lr, momentum=0.9)
    return lambda params: torch.optim.Adam(params, lr=lr)


def _harness(task_name: str, seed: int, workers: int, method: str,
             optimizer: str = "adam", worker_batch: int = 0) -> dict[str, Any]:
    """bench_quality's run of ``method`` ("one", a way's HARNESS_METHOD, or ``localK``), in this process;
    every method but one process on minibatches of ``worker_batch`` rows per worker (0: the task's own)."""
    import bench_quality

    workers = 1 if method == "one" else workers
    run = bench_quality._run((task_name, optimizer, workers, seed, method, 0, 0, 0, 0, False, 0.0,
                              worker_batch))
    if method == "one":
        return {"accuracy": run["accuracy"], "bytes": 0, "dense": 1, "steps": run["steps"]}
    return {"accuracy": run["accuracy"], "bytes": run["bytes"],
            "dense": run["dense"] * run["steps"] * workers, "steps": run["steps"] * workers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="mlp", help="comma-separated tasks of scripts/quality/tasks.py "
                        "(mlp, cnn, seq, mlp1m)")
    parser.add_argument("--workers", type=int, default=2, help="Spark executors and simulated workers")
    parser.add_argument("--optimizer", choices=("adam", "sgd", "rmsprop"), default="adam",
                        help="every run's optimizer, as bench_quality.py's: Adam (lr 1e-3), SGD with "
                        "momentum (0.9, lr 0.01) or RMSprop with momentum (0.9, lr 1e-4)")
    parser.add_argument("--ways", default="default,dl4j",
                        help="comma-separated ways to share, each run in the harness and on Spark: default "
                        "(psrv's defaults), dl4j (DL4J's: dl4j_threshold(), step_from='shared', "
                        "scale_momentum=False), given (psrv's defaults with scale_momentum=False)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per task (medians are reported)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the seeds are first-seed, first-seed + 1, ... (to run seeds in parts)")
    parser.add_argument("--workers-per-node", type=int, default=1,
                        help="Spark: trainers in each task (SharedTrainingMaster(workers_per_node=)), so "
                        "--workers / this many tasks; the harness still simulates --workers workers")
    parser.add_argument("--worker-batch", type=int, default=0, metavar="B",
                        help="every way but one process trains on minibatches of B rows per worker "
                        "(default: the task's own, 32), as bench_quality.py's --worker-batch; one "
                        "process keeps the task's batch")
    parser.add_argument("--local-steps", default="auto", metavar="K[,K...]",
                        help="comma-separated optimizer steps a message, each K a run of the default way: "
                        "a worker splits each minibatch into K pieces and steps on each (on Spark "
                        "SharedTrainingMaster(local_steps=K), in the harness bench_quality.py's localK; K of "
                        "1, 2, 4, 8, and 1 is the harness's onestep); default auto, the master's default "
                        "(the harness's default). Other than auto only with --ways default")
    parser.add_argument("--master", default=None,
                        help="Spark master (default local-cluster[T,1,1024], T = the tasks)")
    parser.add_argument("--save", default=None, help="also write every run to this JSON file")
    parser.add_argument("--load", metavar="FILES", help="run nothing: print the table of the runs saved "
                        "by --save in these comma-separated files (with the same --workers)")
    args = parser.parse_args(argv)
    if args.load:
        runs = [run for path in args.load.split(",") for run in json.loads(Path(path).read_text())]
        print(f"# {len(runs)} runs from {args.load}")
        print(table(runs, args.workers))
        return 0
    names = [t for t in args.tasks.split(",") if t]
    from quality import tasks as task_module

    unknown = sorted(set(names) - set(task_module.TASKS) - {"tiny"})
    if unknown or not names:
        parser.error(f"--tasks: unknown {unknown}; known: mlp, cnn, seq, mlp1m")
    ways = [w for w in args.ways.split(",") if w]
    if not ways or set(ways) - set(WAYS):
        parser.error(f"--ways: expected some of {', '.join(WAYS)}, got {args.ways!r}")
    if args.workers < 1 or args.seeds < 1 or args.first_seed < 0 or args.worker_batch < 0:
        parser.error("--workers and --seeds must be >= 1, --first-seed and --worker-batch >= 0")
    try:
        local_steps: list[int | str] = [k if k == "auto" else int(k)
                                        for k in args.local_steps.split(",") if k]
    except ValueError:
        local_steps = []
    if not local_steps or set(local_steps) - {"auto", 1, *LOCAL_STEPS} \
            or (local_steps != ["auto"] and ways != ["default"]):
        parser.error(f"--local-steps: expected some of auto, 1, {', '.join(str(k) for k in LOCAL_STEPS)} "
                     f"(other than auto with --ways default), got {args.local_steps!r} with --ways "
                     f"{args.ways}")
    per_node = args.workers_per_node
    if per_node < 1 or args.workers % per_node:
        parser.error(f"--workers-per-node must divide --workers ({args.workers}), got {per_node}")
    tasks = args.workers // per_node
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    master = args.master or f"local-cluster[{tasks},1,1024]"
    spark = _spark(master, tasks)
    runs: list[dict[str, Any]] = []
    try:
        for name in names:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                task = task_module.make(name, seed)
                run = {"task": name, "optimizer": args.optimizer, "seed": seed,
                       "worker_batch": args.worker_batch}
                runs.append({**run, "way": "harness", "method": "one", "local_steps": 1,
                             **_harness(name, seed, args.workers, "one", args.optimizer, args.worker_batch)})
                print(f"# {runs[-1]}", file=sys.stderr, flush=True)
                for steps in local_steps:
                    for way in ways:
                        method = HARNESS_METHOD[way] if steps == "auto" else \
                            "onestep" if steps == 1 else f"local{steps}"
                        runs.append({**run, "way": "harness", "method": way, "local_steps": steps,
                                     **_harness(name, seed, args.workers, method, args.optimizer,
                                                args.worker_batch)})
                        print(f"# {runs[-1]}", file=sys.stderr, flush=True)
                    for way in ways:
                        runs.append({**run, "way": "spark", "method": way, "local_steps": steps,
                                     **_spark_fit(spark, task, seed, args.workers, way, per_node,
                                                  args.optimizer, args.worker_batch, steps)})
                        print(f"# {runs[-1]}", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    if args.save:
        Path(args.save).write_text(json.dumps(runs, indent=1))
    print(f"# Spark: {tasks} task(s) of {per_node} trainer(s) each on {master}")
    print(table(runs, args.workers))
    return 0


LABELS = {("harness", "one"): "one process", ("harness", "default"): "harness, default",
          ("harness", "dl4j"): "harness, DL4J's", ("harness", "given"): "harness, optimizer as given",
          ("spark", "default"): "Spark, default", ("spark", "dl4j"): "Spark, DL4J's",
          ("spark", "given"): "Spark, optimizer as given"}


def table(runs: list[dict[str, Any]], workers: int) -> str:
    """One row per task and method: accuracy per seed, median, points against one process (the
    difference of the medians, and seed by seed: the median of each seed's difference from its own
    one-process run, on the same data set and initial weights), steps, bytes, and the median seconds of a
    Spark fit. A task run with SGD or RMSprop, or on another batch per worker, is named apart ("cnn, sgd",
    "cnn, batch 8 per worker"), so runs loaded together are compared only with their like; runs with
    a number of optimizer steps a message set (not the default's "auto") are rows of their own under the
    same name ("Spark, default, 2 local steps"), against the same one process.
    The default's rows are checked against the aims bench_quality.py checks (within 1 point of one
    process at 2 and 4 workers and 2 at 8, in both columns; at most 1/100 of a dense exchange's bytes)."""
    runs = [{**r, "task": r["task"] + (f", {r['optimizer']}" if r.get("optimizer") in ("sgd", "rmsprop")
                                       else "")
             + (f", batch {r['worker_batch']} per worker" if r.get("worker_batch") else "")} for r in runs]
    lines = ["| task | workers | way | accuracy per seed | median | vs one process | seed by seed | "
             "steps, all workers | bytes / dense | wire / dense | of it, heartbeats | Spark seconds | "
             "aims |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def k_of(run: dict[str, Any]) -> int | str:  # one process: "auto", whatever a run says
        return "auto" if run["method"] == "one" else run.get("local_steps", "auto")

    every_k = sorted({k_of(r) for r in runs}, key=lambda k: (k != "auto", str(k)))
    for name in dict.fromkeys(r["task"] for r in runs):
        ones = {r["seed"]: r["accuracy"] for r in runs if r["task"] == name and r["method"] == "one"}
        one = statistics.median(ones.values())
        for (key, label), k in ((item, k) for item in LABELS.items() for k in every_k):
            group = [r for r in runs if r["task"] == name and (r["way"], r["method"]) == key
                     and k_of(r) == k]
            if not group:
                continue
            label = label + ("" if k == "auto" else f", {k} local step{'s' if k != 1 else ''}")
            seconds = f"{statistics.median(r['seconds'] for r in group):.1f}" \
                if all("seconds" in r for r in group) else "-"
            accs = [r["accuracy"] for r in sorted(group, key=lambda r: r["seed"])]
            middle = statistics.median(accs)
            paired = seed_by_seed([(r["seed"], r["accuracy"]) for r in group], ones)
            share = "-" if key[1] == "one" else \
                f"{statistics.median(r['bytes'] / max(1, r['dense']) for r in group):.4f}"
            counted = key[1] != "one" and all("wire" in r for r in group)
            wire = f"{statistics.median(r['wire'] / max(1, r['dense']) for r in group):.4f}" \
                if counted else "-"
            beats = f"{statistics.median(r['beats'] / max(1, r['dense']) for r in group):.4f}" \
                if counted else "-"
            steps = statistics.median(r["steps"] for r in group)
            # the bytes aim: every frame the nodes sent where that was counted, the payloads elsewhere
            ratio = None if share == "-" else float(wire) if counted else float(share)
            aims = aims_verdict(workers, 100 * (middle - one), paired, bytes_ratio=ratio) \
                if key[1] == "default" else "-"
            lines.append(f"| {name} | {1 if key[1] == 'one' else workers} | {label} | "
                         f"{', '.join(f'{a:.3f}' for a in accs)} | {middle:.3f} | "
                         f"{100 * (middle - one):+.1f} | {paired} | {steps:.0f} | {share} | {wire} | "
                         f"{beats} | {seconds} | {aims} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
