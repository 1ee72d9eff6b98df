"""How much memory gradient sharing takes on the driver and on each executor, per model size.

For each model size P (parameters, float32) and each worker count N, real processes on loopback:
one controller process (what the driver runs: the master copy, the shared download snapshot, the
replay ring, the reassembly of chunked messages) and N worker processes, each what a Spark task
holds: a node with its replica and replay ring, a residual encoder (the residual) and a step buffer
(the update a step computes, here a sparse spike pattern written into a dense float32 array). Each
worker trains --steps steps: encode the step buffer into the residual, submit the message, apply
what the others send. Every process samples its own RSS (psutil) every 20 ms.

Reported per role: the RSS added over the process's own baseline (after imports and the numba
kernels' warm-up, before any model-sized array), at its peak, in MiB and as a multiple of the model's
bytes (4 P): what to add to ``spark.driver.memory`` (the controller runs in the driver's Python) and to
``spark.executor.memoryOverhead`` / ``spark.executor.pyspark.memory`` per task (outside the JVM heap).
The model itself (its layers, the updater state of the optimizer) comes on top on both sides.

    .venv/bin/python scripts/bench_memory.py                          # 1 M, 11 M, 50 M x 2, 4 workers
    .venv/bin/python scripts/bench_memory.py --params 1000000 --workers 2 --steps 10    # a quick look

Progress goes to stderr, the table (markdown) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import psutil

MiB = 1024 * 1024


def say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


class PeakRss:
    """This process's RSS, sampled every 20 ms on a thread: the baseline, now, the peak."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.base = self.process.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def report(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(timeout=1.0)
        now = self.process.memory_info().rss
        return {"base": self.base, "peak": max(self.peak, now), "final": now}


def _config(args: argparse.Namespace) -> Any:
    from psrv.transport import TransportConfig

    return TransportConfig(host="127.0.0.1", port=0, heartbeat_s=0.5, missed_beats=20, join_timeout_s=120.0,
                           catchup_timeout_s=300.0, controller_lost_timeout_s=300.0)


def _warm_up() -> None:
    """Compile (or load) the encoding kernels before the baseline, so they are not counted."""
    from psrv.encoding import AdaptiveThreshold, ResidualEncoder, decode

    encoder = ResidualEncoder(4096, threshold_algorithm=AdaptiveThreshold(1e-3))
    message = encoder.encode_update(np.full(4096, 1e-2, np.float32))
    decode(message, np.zeros(4096, np.float32))


def run_controller(args: argparse.Namespace) -> None:
    from psrv.server import Controller

    _warm_up()
    rss = PeakRss()
    params = (np.random.default_rng(0).standard_normal(args.params, dtype=np.float32) * 0.01)
    with Controller(_config(args), params) as controller:
        print(json.dumps({"address": controller.address}), flush=True)
        sys.stdin.readline()  # "stop" from the orchestrator
        counters = controller.counters()
    print(json.dumps({"rss": rss.report(), "updates_applied": counters.get("updates_applied")}), flush=True)


def run_worker(args: argparse.Namespace) -> None:
    from psrv.encoding import AdaptiveThreshold, ResidualEncoder
    from psrv.server import Node

    _warm_up()
    rss = PeakRss()
    node = Node(_config(args), np.zeros(args.params, np.float32), args.address).start()  # the download
    after_replica = psutil.Process().memory_info().rss
    encoder = ResidualEncoder(args.params, threshold_algorithm=AdaptiveThreshold(1e-3))
    step = np.zeros(args.params, np.float32)
    step.fill(0.0)  # resident, as a network's gradient buffer is
    rng = np.random.default_rng(args.seed)
    spikes = max(1, int(args.params * args.sparsity))
    sent = 0
    for _ in range(args.steps):
        step.fill(0.0)
        step[rng.integers(0, args.params, spikes)] = 3e-3
        message = encoder.encode_update(step)
        if message is not None:
            node.submit(message, apply_locally=True)
            sent += 1
    node.wait_acknowledged(timeout_s=120.0)
    print(json.dumps({"done": sent}), flush=True)
    sys.stdin.readline()  # "stop": the others finished too, their updates applied here meanwhile
    counters = node.counters()
    node.stop()
    print(json.dumps({"rss": rss.report(), "after_replica": after_replica,
                      "updates_applied": counters.get("updates_applied"), "sent": sent}), flush=True)


def _child(role: str, args: argparse.Namespace, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--params", str(args.params_one),
            "--steps", str(args.steps), "--sparsity", str(args.sparsity), *extra]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def _line(proc: subprocess.Popen, what: str, timeout_s: float = 600.0) -> dict[str, Any]:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not result or not result[0]:
        proc.kill()
        raise RuntimeError(f"{what}: no answer within {timeout_s:.0f} s (rc {proc.poll()})")
    return json.loads(result[0])


def one_run(params: int, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    args.params_one = params
    controller = _child("controller", args)
    procs = [controller]
    try:
        address = _line(controller, "controller")["address"]
        nodes = [_child("worker", args, "--address", address, "--seed", str(i)) for i in range(workers)]
        procs += nodes
        for i, node in enumerate(nodes):
            _line(node, f"worker {i}")  # done: its steps sent and acknowledged
        time.sleep(2.0)  # the last relays arrive
        for node in nodes:
            node.stdin.write("stop\n")
            node.stdin.flush()
        ends = [_line(node, f"worker {i} (end)") for i, node in enumerate(nodes)]
        controller.stdin.write("stop\n")
        controller.stdin.flush()
        end = _line(controller, "controller (end)")
        return {"controller": end, "workers": ends}
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _added(rss: dict[str, int]) -> float:
    return (rss["peak"] - rss["base"]) / MiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="1000000,11000000,50000000",
                        help="model sizes in parameters, comma-separated (default 1 M, 11 M, 50 M)")
    parser.add_argument("--workers", default="2,4", help="worker counts, comma-separated (default 2,4)")
    parser.add_argument("--steps", type=int, default=20, help="steps each worker trains (default 20)")
    parser.add_argument("--sparsity", type=float, default=1e-3,
                        help="fraction of parameters a step's update changes (default 1e-3)")
    parser.add_argument("--role", choices=("controller", "worker"), help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        args.params = int(args.params)
        (run_controller if args.role == "controller" else run_worker)(args)
        return 0
    sizes = [int(float(p)) for p in args.params.split(",") if p.strip()]
    counts = [int(n) for n in args.workers.split(",") if n.strip()]
    print(f"# bench_memory: {args.steps} steps per worker, sparsity {args.sparsity:g}; RSS added over each "
          "process's baseline, at its peak (psutil, sampled every 20 ms)")
    print("| parameters | model (MiB) | workers | driver: controller (MiB) | × model | "
          "executor: per worker, median [max] (MiB) | × model | updates applied by the controller |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for params in sizes:
        model = params * 4 / MiB
        for workers in counts:
            started = time.monotonic()
            say(f"P={params:,} N={workers} ...")
            run = one_run(params, workers, args)
            ctrl = _added(run["controller"]["rss"])
            per_worker = [_added(w["rss"]) for w in run["workers"]]
            median = statistics.median(per_worker)
            print(f"| {params:,} | {model:,.0f} | {workers} | {ctrl:,.0f} | {ctrl / model:.1f} | "
                  f"{median:,.0f} [{max(per_worker):,.0f}] | {median / model:.1f} | "
                  f"{run['controller']['updates_applied']} |", flush=True)
            say(f"  done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
