"""What the quantile threshold costs a worker's step: τ from a strided sample of the step's sum, against
τ from the whole sum written out first.

``SampledQuantileThreshold`` (the default of ``SharedTrainingMaster``) takes τ every step from a
strided sample of the residual. The fused step paths never write the residual's new value out before
encoding it: the Spark task's ``ResidualEncoder.encode_difference`` (residual += after - before, scan
and encode in one pass) and ``DistributedOptimizer``'s implicit residual (``encode_gap``: the gap
between the step buffer and the live parameters). Given the whole residual, the threshold costs
those paths one more pass over the parameter vector (the sum or the gap written out). Given only
the sampled elements (``prepare_sample``), it costs reading the sample.

Each row times, in rotation on the same vectors, a step of the encoder that way and the other: "whole
residual" (the algorithm seen through a wrapper without ``prepare_sample``: the sum written out, then
``prepare``, then the encoding), "sampled" (as shipped), and the same fused pass with τ held fixed at
the τ the quantile settled on in the first window (the pass alone, no threshold to find, as with DL4J's
adaptive τ). A plain memory copy of the vector (``np.copyto``)
is the baseline of the same run. Both encoders send the same messages, checked on every step.
Medians over ``--repeats`` windows of ``--iterations`` steps (ms per step; the machine is noisy).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from psrv.encoding import (
    FixedThreshold,
    NoResidualPostProcessor,
    ResidualEncoder,
    SampledQuantileThreshold,
)

SIZES = {"1m": 1_060_000, "11m": 11_000_000}


class WholeResidual:
    """The quantile threshold seen without ``prepare_sample``: the encoder writes the sum out first."""

    def __init__(self, inner: SampledQuantileThreshold) -> None:
        self.inner = inner

    @property
    def threshold(self) -> float:
        return self.inner.threshold

    def prepare(self, residual: Any) -> None:
        self.inner.prepare(residual)

    def observe(self, count: int, n: int) -> None:
        self.inner.observe(count, n)

    def get_state(self) -> dict[str, Any]:
        return self.inner.get_state()


def _encoders(n: int, sparsity: float) -> dict[str, ResidualEncoder]:
    def make(algorithm: Any) -> ResidualEncoder:
        return ResidualEncoder(n, threshold_algorithm=algorithm, post_processor=NoResidualPostProcessor())
    return {"whole residual": make(WholeResidual(SampledQuantileThreshold(sparsity=sparsity))),
            "sampled": make(SampledQuantileThreshold(sparsity=sparsity)),
            "fixed tau": make(FixedThreshold(1e-3))}


def measure(n: int, path: str, sparsity: float, iterations: int, repeats: int,
            seed: int = 0) -> dict[str, float]:
    """ms per step of each way (medians of the windows' medians) and of the copy baseline."""
    rng = np.random.default_rng(seed)
    steps = [(rng.standard_normal(n) * 1e-3).astype(np.float32) for _ in range(4)]
    encoders = _encoders(n, sparsity)
    params = {name: rng.standard_normal(n).astype(np.float32) for name in encoders}
    for name in encoders:  # the same start for every way
        params[name][:] = params["whole residual"]
    live = {name: p.copy() for name, p in params.items()}  # encode_gap: the live parameters
    scratch = np.empty(n, dtype=np.float32)
    windows: dict[str, list[float]] = {name: [] for name in (*encoders, "np.copyto")}
    for window in range(repeats + 1):  # the first window warms up (kernels, tau settling)
        times: dict[str, list[float]] = {name: [] for name in windows}
        for i in range(iterations):
            step = steps[i % len(steps)]
            messages = {}
            for name, encoder in encoders.items():
                if path == "difference":
                    before = params[name]
                    after = before + step
                    started = time.perf_counter()
                    messages[name] = encoder.encode_difference(after, before)
                    times[name].append(time.perf_counter() - started)
                    params[name] = after
                else:
                    np.add(params[name], step, out=params[name])  # the optimizer stepped B
                    started = time.perf_counter()
                    messages[name] = encoder.encode_gap(params[name], live[name])
                    times[name].append(time.perf_counter() - started)
            started = time.perf_counter()
            np.copyto(scratch, step)
            times["np.copyto"].append(time.perf_counter() - started)
            whole, sampled = messages["whole residual"], messages["sampled"]
            if (whole is None) != (sampled is None) or \
                    (whole is not None and not np.array_equal(whole, sampled)):
                raise AssertionError(f"the two ways sent different messages at step {i} of window {window}")
        if not window:  # from now on the fixed τ is the one the quantile settled on: as many elements sent
            settled = encoders["sampled"].threshold_algorithm.threshold
            encoders["fixed tau"].threshold_algorithm.threshold = settled
        if window:
            for name, values in times.items():
                windows[name].append(statistics.median(values) * 1e3)
    return {name: statistics.median(values) for name, values in windows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sizes", default="1m,11m", help="comma-separated, of: 1m (1.06 M), 11m (11 M)")
    parser.add_argument("--paths", default="difference,gap",
                        help="difference (the Spark task's encode_difference), gap (DistributedOptimizer's "
                        "implicit residual, encode_gap)")
    parser.add_argument("--sparsity", type=float, default=0.03, help="the quantile threshold's sparsity")
    parser.add_argument("--iterations", type=int, default=30, help="steps per window")
    parser.add_argument("--repeats", type=int, default=5, help="windows; the figures are their medians")
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    paths = [p for p in args.paths.split(",") if p]
    if unknown := sorted(set(sizes) - set(SIZES)):
        parser.error(f"--sizes: unknown {unknown}; known: {', '.join(SIZES)}")
    if unknown := sorted(set(paths) - {"difference", "gap"}):
        parser.error(f"--paths: unknown {unknown}; known: difference, gap")
    if args.iterations < 1 or args.repeats < 1 or not 0 < args.sparsity < 1:
        parser.error("--iterations and --repeats must be >= 1, --sparsity in (0, 1)")
    print("| path | parameters | np.copyto (ms) | fixed τ (ms) | whole residual (ms) | sampled (ms) | "
          "sampled / whole | sampled / copy |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        for size in sizes:
            got = measure(SIZES[size], path, args.sparsity, args.iterations, args.repeats)
            sampled, whole, copy = got["sampled"], got["whole residual"], got["np.copyto"]
            print(f"| {path} | {size} | {copy:.2f} | {got['fixed tau']:.2f} | {whole:.2f} | {sampled:.2f} | "
                  f"{sampled / whole:.2f}x | {sampled / copy:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
