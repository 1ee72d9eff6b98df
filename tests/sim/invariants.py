"""The invariants checked once a run has drained.

* every live node's replica equals the master within float rounding;
* the master equals the initial parameters plus each update it applied, once (recomputed from the
  submissions, so an update applied twice or a foreign one shows even without the apply hook);
* no update was applied twice at any process (counted per submission through the apply hook,
  at a node since its last download);
* none of a live node's updates is missing from the master, also for a node that came back under a
  new member id (partitioned or frozen past the liveness timeout, evicted, re-synced): it re-sends
  what the master lacks after its catch-up, and sends again under its new id what the controller
  gave up of its old one (an own update lost on its way up just before the node went away for
  longer than twice the liveness timeout). Only a crashed or departed process's updates may be
  missing (``stats["lost_crashed_or_left"]``);
* a node rejoined (a new member id) only where a fault touched it;
* no exception escaped a handler and no process stopped by itself (recorded as they happen).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sim.world import World


def tolerance(world: World) -> dict[str, float]:
    if np.dtype(world.config.dtype) == np.float64:
        return {"rtol": 1e-9, "atol": 1e-9}
    return {"rtol": 1e-5, "atol": 1e-4}


def _strict(world: World, sub) -> bool:
    proc = sub.proc
    back = len(proc.ids) > 1
    return proc.live and world.slots.get(proc.slot) is proc and (world.setup.resends_after_rejoin or not back)


def converged(world: World) -> bool:
    """Cheap test used while draining: everyone running, replicas equal, nothing of a live node missing."""
    ctl = world.controller
    if ctl is None or not ctl.live or ctl.frozen_until > world.sched.now:
        return False
    master = ctl.role.replica()
    tol = tolerance(world)
    for slot in range(world.config.nodes):
        proc = world.slots.get(slot)
        if proc is None or not proc.live or proc.frozen_until > world.sched.now or not proc.role.ready():
            return False
        if not np.allclose(proc.role.replica(), master, **tol):
            return False
    applied = world.master_applied
    return all(applied.get(sub.uid) for sub in world.subs if _strict(world, sub))


def check(world: World) -> list[str]:
    failures: list[str] = []
    ctl = world.controller
    if ctl is None or not ctl.live:
        return ["the controller is not running at the end"]
    tol = tolerance(world)
    master = ctl.role.replica()
    expected = world.expected_master()
    if not np.allclose(master, expected, **tol):
        worst = float(np.max(np.abs(master - expected)))
        failures.append(f"the master differs from its applied updates by up to {worst:.3g}")
    for slot in range(world.config.nodes):
        proc = world.slots.get(slot)
        if proc is None or not proc.live:
            failures.append(f"node slot {slot} has no live process at the end")
            continue
        if not proc.role.ready():
            failures.append(f"{proc.name} is not running (joined and synced) at the end")
            continue
        replica = proc.role.replica()
        if not np.allclose(replica, master, **tol):
            worst = float(np.max(np.abs(replica - master)))
            failures.append(f"{proc.name}'s replica differs from the master by up to {worst:.3g}")
        explained = proc.slot in world.disturbed or world.config.faults.loss > 0
        if len(proc.ids) > 1 and not explained:
            failures.append(f"{proc.name} changed member id {proc.ids} though no fault touched it")
    lost = [sub for sub in world.subs if not world.master_applied.get(sub.uid)]
    strict = [sub for sub in lost if _strict(world, sub)]
    if strict:
        names = sorted({sub.proc.name for sub in strict})
        back = sorted({sub.proc.name for sub in strict if len(sub.proc.ids) > 1})
        failures.append(f"{len(strict)} updates of live nodes {names} never reached the master"
                        + (f" (of which came back under a new id: {back})" if back else ""))
    world.stats["submitted"] = len(world.subs)
    world.stats["applied_at_master"] = len(world.master_applied)
    world.stats["came_back"] = sum(1 for p in world.procs if p.live and len(p.ids) > 1)
    world.stats["lost_crashed_or_left"] = sum(
        1 for sub in lost if not (sub.proc.live and world.slots.get(sub.proc.slot) is sub.proc))
    return failures
