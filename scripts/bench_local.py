#!/usr/bin/env python3
"""Benchmark psrv's own-loop path on one machine: ``psrv.run`` (2 workers, gradient sharing) against
torch DDP (2 processes, gloo all-reduce) and one process, each training the same ~1 M-parameter MLP
with AdamW on the same synthetic data until the test accuracy reaches the same target.

Reported per way (medians of ``--repeats`` runs): wall time to the target (process start-up excluded:
the clock starts when every worker is ready), optimizer steps per worker, bytes sent per worker
(psrv: the encoded updates; DDP: the ring all-reduce's 2(N-1)/N of the gradient per step, computed),
and the step overhead of the wrapped optimizer: one process, median time of forward + backward + step
with ``DistributedOptimizer(join=False)`` (its step, the encode and the local apply) against the bare
optimizer, measured in alternation in the same run. Prints Markdown tables, ready for README.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

FEATURES, HIDDEN, CLASSES = 256, (1024, 768), 10


def make_data(n: int = 24000, seed: int = 0) -> tuple[torch.Tensor, ...]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32) * 0.15  # a Bayes limit near 0.72
    y = rng.integers(0, CLASSES, n)
    x = centers[y] + rng.normal(size=(n, FEATURES)).astype(np.float32)
    split = n * 5 // 6
    t = torch.from_numpy
    return t(x[:split]), t(y[:split]), t(x[split:]), t(y[split:])


def make_model(hidden: tuple[int, ...] = HIDDEN) -> torch.nn.Module:
    """The MLP FEATURES -> *hidden -> CLASSES with ReLUs, the same weights in every process (seed 0)."""
    torch.manual_seed(0)
    widths = (FEATURES, *hidden)
    layers: list[torch.nn.Module] = []
    for n_in, n_out in zip(widths, widths[1:], strict=False):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], CLASSES))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train_loop(model, optimizer, rank: int, size: int, target: float, batch: int, max_steps: int,
               every: int, should_stop) -> tuple[int, float]:
    """The loop all three ways share: returns (steps, seconds) until ``should_stop`` says so."""
    x, y, tx, ty = make_data()
    x, y = x[rank::size], y[rank::size]
    g = torch.Generator().manual_seed(rank)
    start = time.perf_counter()
    for step in range(1, max_steps + 1):
        idx = torch.randint(0, len(x), (batch,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % every == 0 and rank == 0:
            with getattr(optimizer, "on_replica", contextlib.nullcontext)():  # psrv: the shared model
                reached = accuracy(model, tx, ty) >= target
        else:
            reached = False
        if should_stop(step, reached):
            return step, time.perf_counter() - start
    return max_steps, time.perf_counter() - start


def psrv_worker(target: float, batch: int, max_steps: int, every: int, stop_file: str,
                hidden: tuple[int, ...] = HIDDEN) -> dict:
    import psrv.torch as pt

    pt.init()
    model = make_model(hidden)
    optimizer = pt.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model)
    torch.set_num_threads(1)

    def should_stop(step: int, reached: bool) -> bool:
        if reached:
            Path(stop_file).touch()
        return reached or (step % 4 == 0 and os.path.exists(stop_file))

    steps, seconds = train_loop(model, optimizer, pt.rank(), pt.size(), target, batch, max_steps, every,
                                should_stop)
    return {"steps": steps, "seconds": seconds, "bytes": optimizer.bytes_sent}


def ddp_worker(rank: int, size: int, port: int, target: float, batch: int, max_steps: int, every: int,
               out: str, hidden: tuple[int, ...] = HIDDEN, host: str = "127.0.0.1") -> None:
    """One DDP rank; rank 0 holds the store at ``host:port`` and writes (steps, seconds, bytes) to ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=size)
    model = torch.nn.parallel.DistributedDataParallel(make_model(hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    flag = torch.zeros(1)
    dist.barrier()

    def should_stop(step: int, reached: bool) -> bool:
        if step % every:
            return False
        flag[0] = 1.0 if reached else 0.0
        dist.all_reduce(flag)
        return bool(flag[0] > 0)

    steps, seconds = train_loop(model, optimizer, rank, size, target, batch, max_steps, every, should_stop)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        Path(out).write_text(f"{steps} {seconds} {int(steps * 4 * params * 2 * (size - 1) / size)}")
    dist.destroy_process_group()


def run_ddp(size: int, target: float, batch: int, max_steps: int, every: int) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.txt")
        mp.spawn(ddp_worker, args=(size, port, target, batch, max_steps, every, out), nprocs=size)
        steps, seconds, sent = Path(out).read_text().split()
    return {"steps": int(steps), "seconds": float(seconds), "bytes": int(sent)}


def run_psrv(size: int, target: float, batch: int, max_steps: int, every: int) -> dict:
    import psrv

    with tempfile.TemporaryDirectory() as tmp:
        result = psrv.run(psrv_worker, target, batch, max_steps, every, os.path.join(tmp, "stop"),
                        num_workers=size)
    return {"steps": result.value["steps"], "seconds": result.value["seconds"],
            "bytes": int(statistics.mean(r["bytes_sent"] for r in result.reports))}


def run_single(target: float, batch: int, max_steps: int, every: int) -> dict:
    torch.set_num_threads(1)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps, seconds = train_loop(model, optimizer, 0, 1, target, batch, max_steps, every,
                                lambda step, reached: reached)
    return {"steps": steps, "seconds": seconds, "bytes": 0}


def step_overhead(batch: int, iterations: int, warmup: int, clock: str = "wall") -> tuple[float, float]:
    """Median seconds of forward + backward + step: bare AdamW, then wrapped (join=False), alternating,
    after ``warmup`` steps of the wrapped one alone (the adaptive threshold starts below its settled
    value: its first messages are denser, until it settled in its sparsity range). ``clock="cpu"`` counts this
    thread's CPU time instead of wall time (one torch thread: on a loaded machine, wall time mostly
    measures the other processes)."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    from psrv.torch import DistributedOptimizer

    torch.set_num_threads(1)
    x, y, _, _ = make_data(4000)
    bare_model, wrapped_model = make_model(), make_model()
    bare = torch.optim.AdamW(bare_model.parameters(), lr=1e-3)
    wrapped = DistributedOptimizer(torch.optim.AdamW(wrapped_model.parameters(), lr=1e-3), wrapped_model,
                                   join=False)
    for i in range(warmup):
        idx = torch.arange(i * batch, (i + 1) * batch) % len(x)
        wrapped.zero_grad()
        torch.nn.functional.cross_entropy(wrapped_model(x[idx]), y[idx]).backward()
        wrapped.step()
    times: dict[str, list[float]] = {"bare": [], "wrapped": []}
    for i in range(iterations):
        for name, model, optimizer in (("bare", bare_model, bare), ("wrapped", wrapped_model, wrapped)):
            idx = torch.arange(i * batch, (i + 1) * batch) % len(x)
            start = now()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times[name].append(now() - start)
    warm = iterations // 5
    return statistics.median(times["bare"][warm:]), statistics.median(times["wrapped"][warm:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.7, help="test accuracy every way trains to")
    parser.add_argument("--batch", type=int, default=64, help="examples per step per worker")
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=25, help="steps between accuracy checks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overhead-iterations", type=int, default=200)
    parser.add_argument("--overhead-warmup", type=int, default=200,
                        help="wrapped steps before the overhead is measured (the threshold settles)")
    parser.add_argument("--only-overhead", action="store_true", help="measure the step overhead only")
    parser.add_argument("--overhead-clock", choices=("wall", "cpu"), default="wall",
                        help="the step overhead in wall time or in the thread's CPU time (a loaded machine)")
    args = parser.parse_args()
    bare, wrapped = step_overhead(args.batch, args.overhead_iterations, args.overhead_warmup,
                                  args.overhead_clock)
    overhead = (f"\n| iteration (forward + backward + step), one process | {args.overhead_clock} ms |\n"
                f"|---|---|\n"
                f"| bare AdamW | {bare * 1e3:.2f} |\n| DistributedOptimizer(join=False), after "
                f"{args.overhead_warmup} steps | {wrapped * 1e3:.2f} ({(wrapped / bare - 1) * 100:+.1f} %) |")
    if args.only_overhead:
        print(overhead)
        return 0
    params = sum(p.numel() for p in make_model().parameters())
    ways = {"one process": lambda: run_single(args.target, args.batch, args.max_steps, args.every),
            f"torch DDP (gloo), {args.workers} processes":
                lambda: run_ddp(args.workers, args.target, args.batch, args.max_steps, args.every),
            f"psrv.run, {args.workers} workers":
                lambda: run_psrv(args.workers, args.target, args.batch, args.max_steps, args.every)}
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    for _ in range(args.repeats):  # alternating, so load changes hit every way alike
        for name, way in ways.items():
            runs[name].append(way())
            print(f"  {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    base = statistics.median(r["seconds"] for r in runs["one process"])
    print(f"MLP of {params:,} parameters, AdamW lr 1e-3, batch {args.batch} per worker, target test accuracy "
          f"{args.target}; medians of {args.repeats} runs\n")
    print("| way | seconds to target | vs one process | steps per worker | MB sent per worker |")
    print("|---|---|---|---|---|")
    for name, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        print(f"| {name} | {seconds:.1f} | {seconds / base:.2f}x | "
              f"{statistics.median(r['steps'] for r in results):.0f} | "
              f"{statistics.median(r['bytes'] for r in results) / 1e6:.1f} |")
    print(overhead)
    return 0


if __name__ == "__main__":
    sys.exit(main())
