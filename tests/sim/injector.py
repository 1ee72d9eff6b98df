"""Process-level faults of one run, scheduled from the seed within the run's fault window.

Partitions cut every link between a group of nodes and everyone else, then heal; a frozen process
gets no ticks and no messages (they wait in its socket buffers and keep its links busy) until it
wakes and handles them all at once; a crash discards a node's machine (whatever was in flight to
it is lost) and a fresh machine with a new routing id and address joins later under the same name;
a clock jump moves one process's clock forward; a leave stops a node cleanly (``Stopping``) and a
fresh one joins later. Per-message faults (loss, duplication, reordering, jitter) live in the
network (``sim.network``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psrv.transport.events import Stopping

if TYPE_CHECKING:
    from sim.network import Process
    from sim.world import World

FAULTS_FROM_S = 0.2  # nodes have joined by then (mostly): faults hit a running mesh


def _window(world: World) -> tuple[float, float]:
    end = max(FAULTS_FROM_S + 0.1, world.config.duration_s - 0.2)
    return FAULTS_FROM_S, end


def schedule_faults(world: World) -> None:
    faults, rng, sched = world.config.faults, world.sched.rng, world.sched
    low, high = _window(world)
    for _ in range(faults.partitions):
        sched.at(rng.uniform(low, high), partition, world, rng.uniform(*faults.partition_s))
    for _ in range(faults.freezes):
        sched.at(rng.uniform(low, high), freeze, world, rng.uniform(*faults.freeze_s))
    for _ in range(faults.crashes):
        sched.at(rng.uniform(low, high), crash, world, rng.uniform(*faults.restart_s))
    for _ in range(faults.clock_jumps):
        sched.at(rng.uniform(low, high), clock_jump, world, rng.uniform(*faults.jump_s))
    for _ in range(faults.leaves):
        sched.at(rng.uniform(low, high), leave, world, rng.uniform(*faults.restart_s))


def _live_nodes(world: World) -> list[Process]:
    return [p for slot, p in sorted(world.slots.items()) if p.live]


def partition(world: World, duration: float) -> None:
    nodes = _live_nodes(world)
    if not nodes or world.calm:
        return
    rng = world.sched.rng
    group = rng.sample(nodes, rng.randint(1, max(1, len(nodes) // 2)))
    names = {p.name for p in group}
    others = [p for p in world.procs if p.live and p.name not in names]
    pairs = []
    for inside in group:
        world.disturbed.add(inside.slot)
        for outside in others:
            pairs.append((inside.name, outside.name))
            pairs.append((outside.name, inside.name))
    world.net.cut.update(pairs)
    world.counts.counts["partitions"] += 1
    world.counts.counts["partitioned_nodes"] += len(group)
    world.note(f"partition {sorted(names)} for {duration:.3f}")
    world.sched.after(duration, _heal, world, pairs)


def _heal(world: World, pairs: list[tuple[str, str]]) -> None:
    world.net.cut.difference_update(pairs)


def freeze(world: World, duration: float) -> None:
    rng = world.sched.rng
    candidates = [p for p in [world.controller, *_live_nodes(world)] if p is not None and p.live]
    if not candidates or world.calm:
        return
    proc = rng.choice(candidates)
    _disturb(world, proc)
    proc.frozen_until = max(proc.frozen_until, world.sched.now + duration)
    world.counts.counts["freezes"] += 1
    world.note(f"freeze {proc.name} for {duration:.3f}")
    world.sched.at(proc.frozen_until, _thaw, world, proc)


def _thaw(world: World, proc: Process) -> None:
    if proc.frozen_until > world.sched.now or not proc.live:
        return
    world.net.thaw(proc)
    if proc.live:
        from psrv.transport.events import Tick

        world.handle(proc, Tick())


def crash(world: World, restart_after: float) -> None:
    nodes = _live_nodes(world)
    if not nodes or world.calm:
        return
    proc = world.sched.rng.choice(nodes)
    proc.alive = False
    world.net.detach(proc)
    world.disturbed.add(proc.slot)
    world.counts.counts["crashes"] += 1
    world.note(f"crash {proc.name}")
    world.sched.after(restart_after, world.start_node, proc.slot)


def clock_jump(world: World, jump: float, target: Process | None = None) -> None:
    candidates = [p for p in [world.controller, *_live_nodes(world)] if p is not None and p.live]
    if not candidates or world.calm:
        return
    proc = target or world.sched.rng.choice(candidates)
    _disturb(world, proc)
    proc.clock_offset += jump
    world.counts.counts["clock_jumps"] += 1
    world.note(f"clock of {proc.name} +{jump:.3f}")


def leave(world: World, rejoin_after: float) -> None:
    nodes = _live_nodes(world)
    if not nodes or world.calm:
        return
    proc = world.sched.rng.choice(nodes)
    proc.leaving = True
    world.disturbed.add(proc.slot)
    world.counts.counts["leaves"] += 1
    world.note(f"leave {proc.name}")
    world.handle(proc, Stopping())
    world.sched.after(1.0, _gone, world, proc)  # a machine that did not say Stop is closed anyway
    world.sched.after(rejoin_after, world.start_node, proc.slot)


def _gone(world: World, proc: Process) -> None:
    if proc.alive and not proc.stopped:
        world.counts.counts["leave_without_stop"] += 1
        proc.alive = False
        world.net.detach(proc)


def _disturb(world: World, proc: Process) -> None:
    if proc.kind == "controller":
        world.disturbed.update(world.slots)  # every node may be evicted for the controller's silence
    else:
        world.disturbed.add(proc.slot)
