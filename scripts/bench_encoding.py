#!/usr/bin/env python3
"""Benchmark psrv.encoding: encode/decode throughput against np.copyto and a plain-NumPy reference.

Every figure is the median of several runs, printed beside baselines measured in the same run:
- encode and decode throughput in GB/s of the input vector (N float32 = 4N bytes), as ratios to a
  plain memory copy of the same vector (np.copyto) and to the NumPy reference of the same rules;
- decode time against the number of elements a sparse message carries (it should follow the count,
  not N);
- the packed form updates travel in (``compact``): its bytes against the encoder's sparse or bitmap
  message, the time to pack against the time to encode, and its decode time against the unpacked one's;
- the first encode + decode in a fresh Python process whose numba cache is already warm.
The tables are Markdown, ready for README.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
from psrv.encoding import compact, decode, encode, message_info
from psrv.encoding._numba_cache import apply_cache_dir_from_env

ROOT = Path(__file__).resolve().parents[1]


def load_reference():
    """The NumPy reference lives beside the tests (tests/unit/encoding_reference.py)."""
    path = ROOT / "tests" / "unit" / "encoding_reference.py"
    spec = importlib.util.spec_from_file_location("encoding_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_seconds(run: Callable[[], object], repeats: int,
                   setup: Callable[[], object] | None = None) -> float:
    """Median wall time of `run` over `repeats` runs (after one untimed warm-up); `setup` is not timed."""
    times = []
    for i in range(repeats + 1):
        if setup is not None:
            setup()
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        if i:
            times.append(elapsed)
    return statistics.median(times)


def threshold_for(vector: np.ndarray, sparsity: float) -> float:
    """The |x| quantile that lets about `sparsity` of the elements through."""
    k = max(1, int(round(sparsity * vector.size)))
    magnitudes = np.abs(vector)
    return float(np.partition(magnitudes, magnitudes.size - k)[magnitudes.size - k])


def throughput_row(base: np.ndarray, sparsity: float, repeats: int, threads: int, ref) -> str:
    """One table row: encode and decode of `base` at `sparsity`, beside np.copyto and the NumPy reference."""
    work = np.empty_like(base)
    gigabytes = base.nbytes / 1e9

    def reset() -> None:
        np.copyto(work, base)

    tau = threshold_for(base, sparsity)
    copy_s = median_seconds(reset, repeats)
    encode_s = median_seconds(lambda: encode(work, tau), repeats, reset)
    threads_s = median_seconds(lambda: encode(work, tau, threads=threads), repeats, reset)
    reference_s = median_seconds(lambda: ref.reference_encode(work, tau), max(3, repeats // 2), reset)
    reset()
    message = encode(work, tau)
    info = message_info(message)
    target = np.zeros_like(base)
    decode_s = median_seconds(lambda: decode(message, target), repeats)
    ref_decode_s = median_seconds(lambda: ref.reference_decode(message, target), max(3, repeats // 2))
    return (f"| {base.size:,} | {sparsity:g} | {info.form} | {gigabytes / copy_s:.1f} | "
            f"{gigabytes / encode_s:.1f} | {copy_s / encode_s:.2f} | {reference_s / encode_s:.1f} | "
            f"{copy_s / threads_s:.2f} | {gigabytes / decode_s:.1f} | {copy_s / decode_s:.2f} | "
            f"{ref_decode_s / decode_s:.1f} |")


def throughput_table(sizes: list[int], sparsities: list[float], repeats: int, threads: int,
                     ref) -> list[str]:
    rng = np.random.default_rng(42)
    header = ("| N | sparsity | form | copy GB/s | encode GB/s | encode / copy | encode / NumPy | "
              f"encode {threads} threads / copy | decode GB/s | decode / copy | decode / NumPy |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print("\n".join(lines), flush=True)
    for n in sizes:
        base = rng.standard_normal(n).astype(np.float32)
        for sparsity in sparsities:
            lines.append(throughput_row(base, sparsity, repeats, threads, ref))
            print(lines[-1], flush=True)
    return lines


def decode_time(n: int, count: int, repeats: int, rng: np.random.Generator) -> tuple[str, float]:
    vector = np.zeros(n, dtype=np.float32)
    vector[rng.choice(n, size=count, replace=False)] = rng.choice([-2.0, 2.0], size=count)
    message = encode(vector, 1.0)
    target = np.zeros(n, dtype=np.float32)
    return message_info(message).form, median_seconds(lambda: decode(message, target), repeats)


def decode_vs_count_table(n: int, counts: list[int], repeats: int) -> list[str]:
    rng = np.random.default_rng(7)
    lines = [f"| N | count | form | decode µs | ns per element sent | time / time at count {counts[0]} |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    first = None
    for count in counts:
        form, seconds = decode_time(n, count, repeats, rng)
        first = first or seconds
        lines.append(f"| {n:,} | {count:,} | {form} | {seconds * 1e6:.1f} | "
                     f"{seconds * 1e9 / count:.1f} | {seconds / first:.1f} |")
        print(lines[-1], flush=True)
    return lines


def packed_row(base: np.ndarray, sparsity: float, repeats: int) -> str:
    """One row: the encoder's message of ``base`` at ``sparsity`` against its packed form."""
    work = np.empty_like(base)

    def reset() -> None:
        np.copyto(work, base)

    tau = threshold_for(base, sparsity)
    encode_s = median_seconds(lambda: encode(work, tau), repeats, reset)
    reset()
    message = encode(work, tau)
    packed = compact(message)
    compact_s = median_seconds(lambda: compact(message), repeats)
    target = np.zeros_like(base)
    decode_s = median_seconds(lambda: decode(message, target), repeats)
    packed_s = median_seconds(lambda: decode(packed, target), repeats)
    info, small = message_info(message), message_info(packed)
    return (f"| {base.size:,} | {sparsity:g} | {info.form} | {message.nbytes:,} | {small.form} | "
            f"{packed.nbytes:,} | {message.nbytes / packed.nbytes:.2f} | {packed.nbytes / info.count:.2f} | "
            f"{compact_s * 1e6:.0f} | {compact_s / encode_s:.2f} | {decode_s * 1e6:.0f} | "
            f"{packed_s * 1e6:.0f} | {packed_s / decode_s:.2f} |")


def packed_table(sizes: list[int], sparsities: list[float], repeats: int) -> list[str]:
    rng = np.random.default_rng(43)
    header = ("| N | sparsity | encoder's form | bytes | wire form | bytes | smaller by | "
              "bytes per element | compact µs | compact / encode | decode µs | decode packed µs | "
              "packed / unpacked |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print("\n".join(lines), flush=True)
    for n in sizes:
        base = rng.standard_normal(n).astype(np.float32)
        for sparsity in sparsities:
            lines.append(packed_row(base, sparsity, repeats))
            print(lines[-1], flush=True)
    return lines


FIRST_CALL_PROBE = """
import json, time
start = time.perf_counter()
import numpy as np
import psrv.encoding
imported = time.perf_counter()
from psrv.encoding import decode, encode
x = np.zeros(1 << 16, dtype=np.float32); x[::97] = 2.0
message = encode(x, 1.0)
decode(message, np.zeros_like(x))
done = time.perf_counter()
print(json.dumps({"import": imported - start, "first_call": done - imported, "total": done - start}))
"""


def first_call_table(runs: int) -> list[str]:
    """Fresh processes with a warm cache: the first run warms it (compiling if needed) and is not counted."""
    results = []
    for i in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", FIRST_CALL_PROBE], capture_output=True, text=True,
                              timeout=300, env=os.environ.copy())
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"first-call probe failed:\n{done.stderr}")
        if i:
            results.append({**json.loads(done.stdout.strip().splitlines()[-1]), "process": wall})
    med = {key: statistics.median(r[key] for r in results) for key in results[0]}
    lines = ["| import numpy + psrv.encoding (s) | first encode + decode (s) | both (s) | "
             "whole process (s) |",
             "|---|---|---|---|",
             f"| {med['import']:.3f} | {med['first_call']:.4f} | {med['total']:.3f} | {med['process']:.3f} |"]
    print("\n".join(lines), flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="N = 1M only, fewer repeats: a few seconds, plus compilation on a cold cache "
                             "(default: off)")
    parser.add_argument("--sizes", type=lambda s: [int(float(v)) for v in s.split(",")], default=None,
                        help="comma-separated vector lengths (default: 1048576,16777216; --quick: 1048576)")
    parser.add_argument("--sparsities", type=lambda s: [float(v) for v in s.split(",")],
                        default=[1e-4, 1e-3, 1e-2, 0.2],
                        help="comma-separated sparsities (default: 1e-4,1e-3,1e-2,0.2)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs per figure; the median is reported (default: 9; --quick: 5)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of the multi-threaded encode column (default: 2)")
    parser.add_argument("--first-call-runs", type=int, default=None,
                        help="fresh processes timed for the first call (default: 5; --quick: 3)")
    args = parser.parse_args(argv)

    sizes = args.sizes or ([1 << 20] if args.quick else [1 << 20, 1 << 24])
    repeats = args.repeats or (5 if args.quick else 9)
    first_runs = args.first_call_runs or (3 if args.quick else 5)
    counts_n = max(sizes)
    counts = [c for c in (100, 1_000, 10_000, 100_000, 1_000_000) if c < counts_n // 16]

    cache = apply_cache_dir_from_env() or "numba's default"

    print(f"# psrv.encoding benchmark: python {sys.version.split()[0]}, numpy {np.__version__}, numba "
          f"{numba.__version__}, {os.cpu_count()} CPUs, numba cache: {cache}")
    print(f"# command: {' '.join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])}")
    print("\n## Throughput (float32, GB/s of the input vector; ratios > 1 mean faster than the baseline)\n")
    ref = load_reference()
    throughput_table(sizes, args.sparsities, repeats, args.threads, ref)
    print("\n## The packed form updates travel in (compact), against the encoder's message\n")
    packed_table(sizes, sorted({*args.sparsities, 0.03, 0.1}), repeats)
    print(f"\n## Decode time against the count of a sparse message (N = {counts_n:,})\n")
    decode_vs_count_table(counts_n, counts, repeats)
    print("\n## First call in a fresh process with a warm numba cache (median of "
          f"{first_runs} processes)\n")
    first_call_table(first_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
