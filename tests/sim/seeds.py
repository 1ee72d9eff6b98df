"""Which seeds a test runs, and running many of them with one report.

``PSRV_SIM_SEED=1234`` runs that seed alone (replay); ``PSRV_SIM_SEEDS=20000`` scales the many-seeds
tests to about that many runs in all (a soak run: 33x the CI's 600); otherwise each runs its default count.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

from sim.faults import FaultCounts
from sim.world import Result


def seed_list(count: int, first: int = 0) -> list[int]:
    """``count`` seeds from ``first`` (pass ``scaled(n)`` for a many-seeds test), or PSRV_SIM_SEED alone."""
    one = os.environ.get("PSRV_SIM_SEED")
    if one:
        return [int(one)]
    return list(range(first, first + count))


CI_RUNS = 600  # the many-seeds tests' default counts together (PLAIN 400, MESH 50, no faults 50, toy 100)


def scaled(default: int) -> int:
    """A per-test count scaled by PSRV_SIM_SEEDS relative to the CI_RUNS of the whole suite."""
    total = os.environ.get("PSRV_SIM_SEEDS")
    return default if not total else max(1, default * int(total) // CI_RUNS)


def with_regressions(seeds: list[int], regressions: tuple[int, ...]) -> list[int]:
    """``seeds`` plus each seed of ``regressions`` it lacks (none when replaying one seed)."""
    if os.environ.get("PSRV_SIM_SEED"):
        return seeds
    return seeds + [s for s in regressions if s not in seeds]


def run_many(seeds: list[int], run: Callable[[int], Result], replay: str) -> FaultCounts:
    """Run every seed; fail with each failing seed's first violations and its replay command."""
    totals = FaultCounts()
    failing: list[str] = []
    started = time.perf_counter()
    for seed in seeds:
        result = run(seed)
        totals.add(result.counts)
        if result.failures:
            first = " | ".join(f[:400] for f in result.failures[:3])
            failing.append(f"seed {seed} ({result.profile}): {first}")
    elapsed = time.perf_counter() - started
    print(f"\n{len(seeds)} seeds in {elapsed:.1f} s ({len(seeds) / max(elapsed, 1e-9):.0f} seeds/s)")
    print(totals.summary())
    if failing:
        raise AssertionError(
            f"{len(failing)} of {len(seeds)} seeds failed:\n"
            + "\n".join(failing[:10])
            + f"\nreplay one: PSRV_SIM_SEED=<seed> .venv/bin/python -m pytest {replay}"
        )
    return totals


def profile_rng(seed: int) -> random.Random:
    """The random source of a seed's fault profile (apart from the run's own, so it can be printed)."""
    return random.Random(f"profile-{seed}")


def digest_elsewhere(code: str, hash_seed: str) -> str:
    """The last line ``code`` prints, run in a fresh interpreter with PYTHONHASHSEED=``hash_seed``:
    a replay happens in another process, where str and bytes hash (and set order) differ."""
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    script = f"import sys\nsys.path.insert(0, {tests!r})\n{code}"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=150, check=True
    )
    return out.stdout.strip().splitlines()[-1]
