#!/usr/bin/env python3
"""What a worker's step of gradient sharing costs beyond the optimizer's own step, pass by pass over the
parameter vector, for MLPs of about 1 M and 11 M parameters (AdamW, CPU, one torch thread).

One process. The wrapped optimizer (``psrv.torch.DistributedOptimizer(join=False)``, the threshold
settled first) takes its steps three ways in rotation, on the same state: the passes apart (as the step
was built before they were fused), the fused passes, and its public ``step()`` end to end. Every
iteration also times the bare AdamW step on a copy of the model with the same gradients: the baseline
every figure is divided by. Each pass is timed alone; the table gives the median per pass over each
window of iterations, then the median over ``--repeats`` windows.

The apply passes are proportional to the message (sparse after the threshold settles): the own apply
(the message into the live parameters), one peer's validate + apply (per other worker) and the
controller's validate + apply into the master copy (once per worker-step).

``--processes`` also runs real processes on loopback: ``psrv.torch.run`` (2 workers, the controller in
the launching process) against torch DDP (gloo, 2 processes), a fixed number of steps each, and prints
the CPU seconds per worker-step of all processes (each worker's process CPU over its measured steps,
plus, for psrv, the launching process's CPU (the controller) within rank 0's measured window, sampled
every 50 ms; rank 0's CPU counts for both workers, as the launcher returns rank 0's value).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from psrv.nn.torch_flat import restore_grad_views

FEATURES, CLASSES, BATCH = 256, 10, 64
SIZES = {"1m": (1024, 768), "11m": (3072, 3072, 256)}  # 1,059,594 and 11,019,018 parameters


def make_model(size: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    widths = (FEATURES, *SIZES[size])
    layers: list[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], CLASSES))


def batch(step: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    centers = torch.Generator().manual_seed(7)
    x = torch.randn(CLASSES, FEATURES, generator=centers)[y] * 0.3 + torch.randn(BATCH, FEATURES, generator=g)
    return x, y


class Timer:
    """Times named passes of one iteration into per-window lists, in CPU seconds of this thread (torch
    and the kernels run on it): on a shared, loaded machine wall time would mostly measure the others."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)

    def __call__(self, name: str, fn: Any, *args: Any) -> Any:
        start = time.thread_time()
        out = fn(*args)
        self.samples[name].append(time.thread_time() - start)
        return out


def step_apart(opt: Any, t: Timer, peer: np.ndarray, master: np.ndarray) -> None:
    """The step as it was: the gradients copied into one buffer, two torch copies, the step, the
    difference, the sum, the scan + encoding."""
    from psrv.encoding.codec import encode_counted

    b, enc = opt._buffers, opt.encoder
    t("apart: gradients copied into the flat gradient buffer", restore_grad_views, b, True, False)
    with torch.no_grad():
        t("apart: load the snapshot (copy)", b.base.copy_, b.flat)
        t("apart: load the step buffer (copy)", b.step_flat.copy_, b.base)
        t("optimizer step on the step buffer", opt.optimizer.step)
        update = t("apart: the difference after - before", b.step_flat.sub_, b.base).numpy()
    t("apart: residual += difference", np.add, enc.residual, update, enc.residual)
    tau = enc.threshold_algorithm.threshold
    message, count = t("apart: threshold scan + encode", encode_counted, enc.residual, tau)
    after_encode(opt, t, message, count, tau, peer, master, "apart")


def step_fused(opt: Any, t: Timer, peer: np.ndarray, master: np.ndarray) -> None:
    """The step now: one pass loads both buffers, one adds the difference, scans and encodes."""
    from psrv.encoding.codec import add_difference_encode_counted, copy_to_both

    b, enc = opt._buffers, opt.encoder
    t("fused: gradients handed to the step buffer (no copy)", restore_grad_views, b, True, True)
    t("fused: load snapshot + step buffer (one pass)", copy_to_both, b.flat.numpy(), b.base.numpy(),
      b.step_flat.numpy())
    t("optimizer step on the step buffer", opt.optimizer.step)
    tau = enc.threshold_algorithm.threshold
    message, count = t("fused: residual += after - before, scan, encode (one pass)",
                       add_difference_encode_counted, enc.residual, b.step_flat.numpy(), b.base.numpy(), tau)
    after_encode(opt, t, message, count, tau, peer, master, "fused")


def after_encode(opt: Any, t: Timer, message: Any, count: int, tau: float, peer: np.ndarray,
                 master: np.ndarray, way: str) -> None:
    from psrv.encoding import decode, decode_validated, message_info

    enc = opt.encoder
    clipped = enc.post_processor.steps + 1
    t(f"{way}: residual clipping, threshold update", enc._after_encode, message, count, tau)
    if clipped % getattr(enc.post_processor, "every", 1) == 0:
        t.samples[f"{way}: the clipping step itself"].append(t.samples[f"{way}: residual clipping, threshold "
                                                                       "update"][-1])
    opt.iterations += 1
    if message is None:
        return
    t(f"{way}: own apply (into the live parameters)", decode, message, opt._buffers.host_view)
    t(f"{way}: a peer's validate + apply", lambda: (message_info(message), decode_validated(message, peer)))
    t(f"{way}: the controller's validate + apply", lambda: (message_info(message),
                                                            decode_validated(message, master)))


def measure(size: str, iterations: int, repeats: int, warmup: int) -> tuple[dict, dict]:
    """Per pass: the median over repeats of each window's median (seconds); and the parameter count."""
    from psrv.encoding import AdaptiveThreshold
    from psrv.torch import DistributedOptimizer

    torch.set_num_threads(1)
    bare_model, model = make_model(size), make_model(size)
    bare = torch.optim.AdamW(bare_model.parameters(), lr=1e-3)
    # SharedTrainingMaster's default start (1e-3): the dense start of 1e-4 would take long to leave at 11 M
    opt = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model, join=False,
                               threshold_algorithm=AdaptiveThreshold(1e-3))
    n = opt.num_params
    x, y = batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for _ in range(warmup):  # the threshold settles on one gradient (no forward/backward needed)
        opt.step()
    peer = opt.flat_params.detach().numpy().copy()
    master = peer.copy()
    windows: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        t = Timer()
        for i in range(iterations):
            x, y = batch(i + 1)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy
            t("forward + backward", lambda x=x, y=y, loss=loss: loss(model(x), y).backward())
            for p, q in zip(bare_model.parameters(), model.parameters(), strict=True):
                p.grad = q.grad.detach().clone()
            t("bare AdamW step (baseline)", bare.step)
            way = i % 3
            if way == 0:
                step_apart(opt, t, peer, master)
            elif way == 1:
                step_fused(opt, t, peer, master)
            else:
                t("DistributedOptimizer.step() end to end", opt.step)
        for name, values in t.samples.items():
            if name.endswith("the clipping step itself"):
                windows[name].append(statistics.mean(values))
            else:
                windows[name].append(statistics.median(values))
    return {name: statistics.median(v) for name, v in windows.items()}, {"params": n}


def print_table(size: str, figures: dict, info: dict, repeats: int, iterations: int) -> None:
    base = figures["bare AdamW step (baseline)"]
    print(f"\n### MLP of {info['params']:,} parameters ({size}); medians of {repeats} windows of "
          f"{iterations} iterations; load average {os.getloadavg()[0]:.1f}\n")
    print("| pass | CPU ms | x bare step |\n|---|---|---|")
    order = sorted(figures, key=lambda k: (not k.startswith(("forward", "bare", "optimizer")),
                                           k.startswith("fused"), k.startswith("Distributed")))
    for name in order:
        print(f"| {name} | {figures[name] * 1e3:.2f} | {figures[name] / base:.3f} |")
    apart = sum(v for k, v in figures.items() if k.startswith("apart:") and "clipping step" not in k)
    fused = sum(v for k, v in figures.items() if k.startswith("fused:") and "clipping step" not in k)
    step = figures["optimizer step on the step buffer"]
    for way, extra in (("passes apart", apart), ("fused", fused)):
        print(f"| **total, {way}** (gradients, optimizer step, its passes) | {(step + extra) * 1e3:.2f} | "
              f"{(step + extra) / base:.3f} |")


def process_worker(size: str, steps: int, warmup: int) -> dict:
    import psrv.torch as pt

    pt.init()
    torch.set_num_threads(1)
    model = make_model(size)
    from psrv.encoding import AdaptiveThreshold

    opt = pt.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model,
                                  threshold_algorithm=AdaptiveThreshold(1e-3))
    cpu = wall = start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            cpu, wall, start = time.process_time(), time.perf_counter(), time.time()
        x, y = batch(step, pt.rank())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "steps": steps,
            "window": (start, time.time())}


def ddp_worker(rank: int, size: str, steps: int, warmup: int, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(make_model(size))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cpu = wall = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            cpu, wall = time.process_time(), time.perf_counter()
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{time.process_time() - cpu} {time.perf_counter() - wall}")
    dist.destroy_process_group()


def run_processes(size: str, steps: int, warmup: int) -> dict[str, float]:
    """CPU seconds per worker-step, all processes, and wall seconds per step: psrv and DDP."""
    import socket
    import tempfile

    import psrv.torch as pt
    import torch.multiprocessing as mp

    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:  # the launching process's CPU (the controller's thread) against the clock
        while not done.wait(0.05):
            samples.append((time.time(), time.process_time()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = pt.run(process_worker, size, steps, warmup, num_workers=2)
    finally:
        done.set()
        sampler.join(5)
    workers = [result.value]  # rank 0's figures; the ranks run the same loop
    start, end = workers[0]["window"]
    inside = [c for t, c in samples if start <= t <= end]
    controller = inside[-1] - inside[0] if len(inside) > 1 else 0.0
    psrv_cpu = (2 * workers[0]["cpu"] + controller) / (2 * steps)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp")
        mp.spawn(ddp_worker, args=(size, steps, warmup, port, out), nprocs=2)
        ddp = [tuple(map(float, Path(f"{out}.{r}").read_text().split())) for r in range(2)]
    return {"psrv": psrv_cpu, "ddp": sum(c for c, _ in ddp) / (2 * steps),
            "psrv_wall": statistics.mean(w["wall"] for w in workers) / steps,
            "ddp_wall": statistics.mean(w for _, w in ddp) / steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1m,11m", help="comma-separated, of: " + ", ".join(SIZES))
    parser.add_argument("--iterations", type=int, default=30, help="iterations per window (a multiple of 3)")
    parser.add_argument("--repeats", type=int, default=3, help="windows; the figures are their median")
    parser.add_argument("--warmup", type=int, default=150, help="wrapped steps before timing (tau settles)")
    parser.add_argument("--processes", action="store_true",
                        help="also CPU per worker-step with real processes: psrv.torch.run vs DDP")
    parser.add_argument("--process-steps", type=int, default=40)
    parser.add_argument("--only-processes", action="store_true", help="skip the pass-by-pass tables")
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {unknown}; expected some of {list(SIZES)}")
    for size in [] if args.only_processes else sizes:
        figures, info = measure(size, args.iterations, args.repeats, args.warmup)
        print_table(size, figures, info, args.repeats, args.iterations)
        sys.stdout.flush()
    if args.processes or args.only_processes:
        print("\n| model | CPU s per worker-step, psrv (2 workers + controller) | DDP (2 processes) | "
              "ratio, median of the runs | wall s per step psrv / DDP | load average |\n" + "|---" * 6 + "|")
        for size in sizes:
            runs = []
            for k in range(args.repeats):
                runs.append(run_processes(size, args.process_steps, 10))
                print(f"# {size}, run {k + 1}: psrv {runs[-1]['psrv']:.4f} s, DDP {runs[-1]['ddp']:.4f} s, "
                      f"{runs[-1]['psrv'] / runs[-1]['ddp']:.3f}x, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            ratio = statistics.median(r["psrv"] / r["ddp"] for r in runs)  # each run against its own DDP
            print(f"| {size} | {med['psrv']:.3f} | {med['ddp']:.3f} | {ratio:.2f}x | "
                  f"{med['psrv_wall']:.3f} / {med['ddp_wall']:.3f} | {os.getloadavg()[0]:.1f} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
