#!/usr/bin/env python3
"""How far could the wrapped optimizer's step overhead fall without its snapshot? A measurement of
sketches, not of psrv's API.

``DistributedOptimizer.step()`` on the host moves seven streams of the parameter vector per step beyond
the optimizer's own: the load reads the live parameters and writes the snapshot and the step buffer;
the fused sum + scan + encode reads the step buffer, the snapshot and the residual and writes the
residual. Fusing passes does not change those bytes, and on a 1 M-parameter MLP they are most of what
the wrapped step costs over the bare one. This script times, in one process and in alternation with
the bare AdamW step (forward + backward + step, one torch thread, the thread's CPU time, medians):

- ``now``: ``DistributedOptimizer.step()`` as shipped;
- ``no-snapshot``: the step buffer loaded from the live parameters, the optimizer's step and the encode
  against the live parameters, all under the lock (the snapshot's write and the load's second stream
  gone). It keeps the parameters right only if every writer of the live parameters takes the lock, and
  it holds the lock through the optimizer's step: an update decoded meanwhile waits, and one written
  without the lock would be taken for part of the step;
- ``no-load``: ``no-snapshot`` with the step buffer reloaded after the own apply instead of before the
  next step (a lower bound for folding the load into the encode pass).

Run: ``python scripts/bench_step_designs.py --runs 3``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from bench_local import make_data, make_model
from psrv.encoding import decode
from psrv.nn.torch_flat import restore_grad_views
from psrv.torch import DistributedOptimizer

DESIGNS = ("now", "no-snapshot", "no-load")


def sketch_step(opt: DistributedOptimizer, design: str) -> None:
    """One wrapped step the way ``design`` would take it (join=False: the own apply is a decode)."""
    buffers = opt._buffers
    restore_grad_views(buffers, keep_missing=True, adopt=True)
    if design == "now":
        opt.step()
        return
    with opt.lock:
        if design == "no-snapshot":
            buffers.step_flat.copy_(buffers.flat)
        opt.optimizer.step()
        message = opt.encoder.encode_difference(buffers.step_flat.numpy(), buffers.host_view)
        if message is not None:
            decode(message, buffers.host_view)
        if design == "no-load":
            buffers.step_flat.copy_(buffers.flat)


def overhead(design: str, iterations: int, warmup: int, batch: int = 64) -> float:
    """Median CPU time of the wrapped iteration over the bare one, minus 1, measured in alternation."""
    torch.set_num_threads(1)
    x, y, _, _ = make_data(4000)
    bare_model, model = make_model(), make_model()
    bare = torch.optim.AdamW(bare_model.parameters(), lr=1e-3)
    wrapped = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model, join=False)
    if design == "no-load":  # its step buffer is loaded at the end of the step before
        wrapped._buffers.step_flat.copy_(wrapped._buffers.flat)
    times: dict[str, list[float]] = {"bare": [], "wrapped": []}
    for i in range(warmup + iterations):
        idx = torch.arange(i * batch, (i + 1) * batch) % len(x)
        for name, net, step, zero in (("bare", bare_model, bare.step, bare.zero_grad),
                                      ("wrapped", model, lambda: sketch_step(wrapped, design),
                                       wrapped.zero_grad)):
            if i < warmup and name == "bare":
                continue
            start = time.thread_time()
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            zero()
            loss.backward()
            step()
            if i >= warmup:
                times[name].append(time.thread_time() - start)
    return statistics.median(times["wrapped"]) / statistics.median(times["bare"]) - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=200, help="wrapped steps first (the threshold settles)")
    args = parser.parse_args()
    results: dict[str, list[float]] = {design: [] for design in DESIGNS}
    for _ in range(args.runs):  # the designs in rotation, so the machine's load hits each alike
        for design in DESIGNS:
            results[design].append(overhead(design, args.iterations, args.warmup))
            print(f"  {design}: {results[design][-1] * 100:+.1f} %", file=sys.stderr, flush=True)
    print("| design | overhead over the bare AdamW iteration (runs) | median |\n|---|---|---|")
    for design, values in results.items():
        runs = ", ".join(f"{v * 100:+.1f} %" for v in values)
        print(f"| {design} | {runs} | **{statistics.median(values) * 100:+.1f} %** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
