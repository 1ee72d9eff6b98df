"""When Spark pays off: psrv's overhead per step and per epoch against the step's own compute time.

Two measurements, in one run:

1. **The sharing cost per step** (no Spark): what gradient sharing adds to each step of a worker for a
   model of P parameters: encoding the step's update into the residual (a pass over P) and applying
   each peer's message (a decode). Median over --repeats steps, for each --params.
2. **The crossover on Spark** (``--spark``): ``local-cluster[W,1,1024]``, a TorchNetwork whose forward
   waits a fixed step time t (``time.sleep``: compute that does not compete for these cores, as a
   GPU's or another machine's), trained by gradient sharing for --epochs epochs of --steps steps in all
   (each worker takes steps / W); the median time of a later epoch (the first pays the export and the
   controller's start) against the same steps trained in one process (the same module, one thread, a
   second epoch of ``TorchNetwork.fit`` after a first one that warms it up). The speed-up is one
   process / Spark; the threshold is the step time where it crosses 1 (interpolated between the two
   step times around it).

    .venv/bin/python scripts/bench_spark_overhead.py                       # the sharing cost only
    .venv/bin/python scripts/bench_spark_overhead.py --spark --step-ms 0,2,5,10,20,50

Progress goes to stderr, the tables (markdown) to stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # bench_spark's session helper


def say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def sharing_cost(params: int, workers: int, repeats: int, sparsity: float) -> dict[str, float]:
    """Seconds per step: encode one update of ``params``, decode (apply) one peer message."""
    from psrv.encoding import AdaptiveThreshold, ResidualEncoder, decode

    encoder = ResidualEncoder(params, threshold_algorithm=AdaptiveThreshold(1e-3))
    rng = np.random.default_rng(0)
    step = np.zeros(params, np.float32)
    replica = np.zeros(params, np.float32)
    spikes = max(1, int(params * sparsity))
    encodes, decodes = [], []
    for _ in range(repeats + 2):
        step.fill(0.0)
        step[rng.integers(0, params, spikes)] = 3e-3
        started = time.perf_counter()
        message = encoder.encode_update(step)
        encodes.append(time.perf_counter() - started)
        if message is not None:
            started = time.perf_counter()
            decode(message, replica)
            decodes.append(time.perf_counter() - started)
    encode_s = statistics.median(encodes[2:])  # the first two: warm-up
    decode_s = statistics.median(decodes[2:]) if len(decodes) > 2 else 0.0
    return {"encode_s": encode_s, "decode_s": decode_s, "step_s": encode_s + (workers - 1) * decode_s}


def _sleepy_module(step_s: float, features: int, classes: int) -> Any:
    import torch
    from torch import nn

    class SleepyNet(nn.Module):
        """A linear classifier whose forward takes ``step_s`` more: a step of known compute time."""

        def __init__(self) -> None:
            super().__init__()
            self.out = nn.Linear(features, classes)
            self.step_s = step_s

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.step_s > 0:
                time.sleep(self.step_s)
            return self.out(x)

    return SleepyNet()


def _network(step_s: float, seed: int) -> Any:
    import torch
    from psrv.nn import TorchNetwork
    from torch import nn

    return TorchNetwork(_sleepy_module(step_s, 64, 10), nn.CrossEntropyLoss(), input_shape=(64,),
                        optimizer=lambda p: torch.optim.SGD(p, lr=1e-2), seed=seed)


def crossover(args: argparse.Namespace) -> list[dict[str, float]]:
    import torch
    from bench_spark import spark_session
    from psrv.encoding import AdaptiveThreshold
    from psrv.nn.data import DataSet
    from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration

    torch.set_num_threads(1)  # as each task runs (PySpark's OMP_NUM_THREADS = spark.task.cpus = 1)
    rows = args.steps * args.batch_size
    rng = np.random.default_rng(1)
    data = DataSet.from_class_indices(rng.standard_normal((rows, 64)).astype(np.float32),
                                      rng.integers(0, 10, rows), 10)
    spark = spark_session(f"local-cluster[{args.workers},1,1024]", args.workers)
    sc = spark.sparkContext
    rdd = sc.parallelize(list(data.batches(args.batch_size)), args.workers).cache()
    rdd.count()
    out = []
    try:
        for step_ms in args.step_ms:
            step_s = step_ms / 1000.0
            say(f"step {step_ms} ms: Spark ...")
            master = SharedTrainingMaster(VoidConfiguration(unicast_port=0, join_timeout_ms=120_000),
                                          batch_size_per_worker=args.batch_size, num_workers=args.workers,
                                          threshold_algorithm=AdaptiveThreshold(1e-3), progress=False)
            spark_net = SparkNetwork(sc, _network(step_s, 0), master)
            spark_net.fit(rdd, epochs=args.epochs)
            later = [record.seconds for record in spark_net.history[1:]]
            spark_net.close()
            say(f"step {step_ms} ms: one process ...")
            local = _network(step_s, 0)
            local.fit(data, epochs=1, batch_size=args.batch_size)  # warm-up, as Spark's first epoch
            started = time.perf_counter()
            local.fit(data, epochs=1, batch_size=args.batch_size)
            one = time.perf_counter() - started
            epoch = statistics.median(later)
            out.append({"step_ms": step_ms, "spark_s": epoch, "one_s": one, "speedup": one / epoch})
            say(f"  Spark epoch {epoch:.2f} s, one process {one:.2f} s")
    finally:
        spark.stop()
    return out


def _threshold(rows: list[dict[str, float]]) -> float | None:
    """The step time (ms) where the speed-up crosses 1, interpolated; None when it never does."""
    for low, high in zip(rows, rows[1:], strict=False):
        if low["speedup"] < 1.0 <= high["speedup"]:
            share = (1.0 - low["speedup"]) / (high["speedup"] - low["speedup"])
            return low["step_ms"] + share * (high["step_ms"] - low["step_ms"])
    return rows[0]["step_ms"] if rows and rows[0]["speedup"] >= 1.0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="1000000,11000000,50000000",
                        help="model sizes for the sharing cost, comma-separated (default 1 M, 11 M, 50 M)")
    parser.add_argument("--sparsity", type=float, default=1e-3,
                        help="fraction of parameters one update carries (default 1e-3)")
    parser.add_argument("--repeats", type=int, default=9, help="steps timed per size (median; default 9)")
    parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--spark", action="store_true", help="also measure the crossover on local-cluster")
    parser.add_argument("--step-ms", default="0,2,5,10,20,50",
                        help="step times for --spark, ms, comma-separated (default 0,2,5,10,20,50)")
    parser.add_argument("--steps", type=int, default=80, help="steps per epoch in all (default 80)")
    parser.add_argument("--batch-size", type=int, default=16, help="minibatch size (default 16)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per fit; the first is not counted")
    args = parser.parse_args(argv)
    args.step_ms = [float(s) for s in args.step_ms.split(",") if s.strip()]
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (the first epoch is not counted)")

    print(f"# bench_spark_overhead: sharing cost per step ({args.workers} workers, "
          f"sparsity {args.sparsity:g}, median of {args.repeats})")
    print("| parameters | encode (ms) | apply one peer's update (ms) | per step, all peers (ms) |")
    print("|---:|---:|---:|---:|")
    for params in [int(float(p)) for p in args.params.split(",") if p.strip()]:
        cost = sharing_cost(params, args.workers, args.repeats, args.sparsity)
        print(f"| {params:,} | {cost['encode_s'] * 1e3:.2f} | {cost['decode_s'] * 1e3:.3f} | "
              f"{cost['step_s'] * 1e3:.2f} |", flush=True)
    if not args.spark:
        return 0
    rows = crossover(args)
    print()
    print(f"# crossover: local-cluster[{args.workers},1,1024], {args.steps} steps of {args.batch_size} "
          f"per epoch, median of epochs 2..{args.epochs}; one process: the same module and steps")
    print("| step time (ms) | Spark, per epoch (s) | one process (s) | speed-up |")
    print("|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['step_ms']:g} | {row['spark_s']:.2f} | {row['one_s']:.2f} | {row['speedup']:.2f} |")
    threshold = _threshold(rows)
    print()
    print(f"Spark pays off from a step time of about {threshold:.1f} ms" if threshold is not None
          else "Spark did not pay off at any step time measured")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
