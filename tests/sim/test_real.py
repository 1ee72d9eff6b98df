"""The real machines (server/controller_machine.py, server/node_machine.py) in the simulation.

Thousands of seeds, each a small mesh (a controller, 3-5 nodes, 64-256 float64 parameters) under a
seeded mix of faults; a 1 024-node MESH with churn; a join burst while updates flow; determinism of
the whole trace (twice in this process, and across PYTHONHASHSEED in two fresh interpreters).
Replay one seed: ``PSRV_SIM_SEED=<seed> .venv/bin/python -m pytest tests/sim/test_real.py -k <test>``.
"""

from __future__ import annotations

import os

import pytest

from sim.faults import Faults
from sim.roles import controller_available, real_setup
from sim.seeds import digest_elsewhere, profile_rng, run_many, scaled, seed_list
from sim.world import Result, SimConfig, World

REASON = controller_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SEEDS = 1000  # per test_real_seeds run; with the toy and the other tests about 2 000 runs in CI

# Seeds of run_small on which the simulation found a protocol bug in the machines: each is a strict
# xfail below (it passes, and so fails the suite, once the bug is fixed: then delete its line) and is
# left out of test_real_seeds. Replay: PSRV_SIM_SEED=<seed> PSRV_SIM_TRACE=/tmp/trace.txt ... -k known_bug
# A node that missed a relayed update (lost, or dropped at a full queue) of an origin that then departed
# (evicted after a freeze or partition, rejoined under a new id) never repairs it. Beats carry only
# contiguous watermarks: an update the master holds above a gap the departed origin never fills is
# invisible (seed 100173: the master has 2:7 plus {9, 10}, n3 lacks 2/9), and once the origin is pruned
# nothing compares it at all.
_DEPARTED_GAP = (
    "a node never repairs a missed update of an origin that departed (beats carry contiguous marks only)"
)
KNOWN_BUGS = {100173: _DEPARTED_GAP, 100568: _DEPARTED_GAP, 100643: _DEPARTED_GAP, 100888: _DEPARTED_GAP}


def small(seed: int, faults: Faults | None = None) -> SimConfig:
    rng = profile_rng(seed)
    faults = Faults.draw(rng) if faults is None else faults
    return SimConfig(
        nodes=rng.randint(3, 5), model_size=rng.choice((64, 128, 256)), duration_s=1.0, faults=faults
    )


def run_small(seed: int, faults: Faults | None = None) -> Result:
    return World(seed, real_setup(), small(seed, faults)).run()


def test_real_seeds_without_faults() -> None:
    run_many(
        seed_list(scaled(20), first=0),
        lambda s: run_small(s, Faults()),
        "tests/sim/test_real.py::test_real_seeds_without_faults",
    )


def test_real_seeds() -> None:
    replay = bool(os.environ.get("PSRV_SIM_SEED"))
    seeds = [s for s in seed_list(scaled(SEEDS), first=100_000) if replay or s not in KNOWN_BUGS]
    run_many(seeds, run_small, "tests/sim/test_real.py::test_real_seeds")


@pytest.mark.parametrize(
    "seed", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=r)) for s, r in KNOWN_BUGS.items()]
)
def test_known_bug(seed: int) -> None:
    run_small(seed).check(f"tests/sim/test_real.py::test_known_bug[{seed}]")


def test_same_seed_same_trace() -> None:
    seed = int(os.environ.get("PSRV_SIM_SEED", 77))
    faults = Faults(
        loss=0.01,
        duplicate=0.05,
        reorder=0.1,
        jitter_s=0.01,
        partitions=1,
        freezes=1,
        crashes=1,
        clock_jumps=1,
        leaves=1,
        hostile=1,
    )
    one, two = run_small(seed, faults), run_small(seed, faults)
    assert one.digest == two.digest and one.stats == two.stats
    assert one.digest != run_small(seed + 1, faults).digest


_DIGEST = """
from sim.faults import Faults
from sim.test_real import run_small
faults = Faults(loss=0.01, duplicate=0.05, reorder=0.1, jitter_s=0.01, partitions=1, freezes=1, crashes=1,
                clock_jumps=1, hostile=1)
print(run_small(5, faults).digest)
"""


def test_same_trace_whatever_the_hash_seed() -> None:
    assert digest_elsewhere(_DIGEST, "1") == digest_elsewhere(_DIGEST, "2")


def test_join_burst_while_updates_flow() -> None:
    """Issue 15: 120 nodes join within 10 ms while 8 others submit; admission control holds some back."""
    for seed in seed_list(1, first=500):
        cfg = SimConfig(
            nodes=128,
            model_size=128,
            duration_s=2.0,
            drain_s=15.0,
            update_every_s=(0.05, 0.2),
            tick_s=(0.02, 0.05),
            extra={"burst": (120, 0.5)},
        )
        World(seed, real_setup(hostile=False), cfg).run().check("tests/sim/test_real.py::test_join_burst")


@pytest.mark.slow
def test_mesh_1024_with_churn() -> None:
    """A 1 024-node MESH (fan-out 8, depth <= 4): join, relayed updates, churn (crashes and leaves that
    rejoin), checked with the same invariants."""
    for seed in seed_list(1, first=900):
        faults = Faults(crashes=6, leaves=6, freezes=2, restart_s=(0.05, 0.3))
        cfg = SimConfig(
            nodes=1024,
            model_size=64,
            duration_s=2.5,
            drain_s=20.0,
            update_every_s=(2.0, 6.0),
            tick_s=(0.03, 0.05),
            join_at_s=(0.0, 0.5),
            faults=faults,
            extra={"mesh": "mesh", "fan_out": 8, "join_rate_per_s": 5000.0, "max_pending_joins": 1024},
        )
        world = World(seed, real_setup(hostile=False), cfg)
        result = world.run()
        mesh = world.controller.role.machine.mesh
        assert len(mesh.node_ids()) == 1024 and mesh.depth() <= 4
        print(f"\nmesh 1024: {dict(result.stats)}; {result.counts.summary()}")
        result.check("tests/sim/test_real.py::test_mesh_1024_with_churn")
