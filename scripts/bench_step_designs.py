#!/usr/bin/env python3
"""What the wrapped optimizer's host step costs, as shipped and as it was designed before. A measurement
of two designs of the same step, not of psrv's API.

- ``implicit`` (as shipped): ``DistributedOptimizer.step()``. The step buffer is persistent and the
  residual is its gap to the live parameters (psrv.encoding.implicit_residual): the optimizer's step,
  then, under the lock, the node's writes mirrored into the step buffer (none here) and one pass that
  reads the step buffer and the live parameters, encodes the gap and applies the message to the live
  parameters. Residual clipping moves the step buffer every 5th step (one more pass then).
- ``explicit`` (the design before): the live parameters loaded into a snapshot and the step buffer (one
  read, two writes), the optimizer's step, one pass adding the step (step buffer minus snapshot) to a
  stored residual and encoding it (three reads, one write), then the message decoded into the live
  parameters under the lock.

Both in one process and in alternation with the bare AdamW step (forward + backward + step, one torch
thread, the thread's CPU time, medians), the designs in rotation so the machine's load hits each alike.

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
from psrv.encoding.codec import copy_to_both
from psrv.nn.torch_flat import restore_grad_views
from psrv.torch import DistributedOptimizer

DESIGNS = ("implicit", "explicit")


def sketch_step(opt: DistributedOptimizer, design: str) -> None:
    """One wrapped step the way ``design`` takes it (join=False: the own apply is a decode). The
    explicit design keeps its residual in ``opt.encoder.residual``, which the implicit one never reads
    in this configuration."""
    if design == "implicit":
        opt.step()
        return
    buffers = opt._buffers
    restore_grad_views(buffers, keep_missing=True, adopt=True)
    if buffers.base is None:
        buffers.base = torch.empty_like(buffers.flat)
    copy_to_both(buffers.host_view, buffers.base.numpy(), buffers.step_flat.numpy())
    opt.optimizer.step()
    message = opt.encoder.encode_difference(buffers.step_flat.numpy(), buffers.base.numpy())
    if message is not None:
        with opt.lock:
            decode(message, buffers.host_view)


def overhead(design: str, iterations: int, warmup: int, batch: int = 64) -> float:
    """Median CPU time of the wrapped iteration over the bare one, minus 1, measured in alternation."""
    torch.set_num_threads(1)
    x, y, _, _ = make_data(4000)
    bare_model, model = make_model(), make_model()
    bare = torch.optim.AdamW(bare_model.parameters(), lr=1e-3)
    wrapped = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model, join=False)
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
