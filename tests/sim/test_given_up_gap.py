"""An own update lost on its way up just before its node is cut off for longer than the liveness timeout.

The controller receives the node's later updates, so it holds a gap in the node's seqs; the node is
marked offline before it could re-send (two beats of a stuck watermark), and the controller gives the
gap up (its watermark must move on for everyone else). At the heal the node rejoins under a new id:
its download says which seqs of the old id were given up, and it sends that update again under the
new id. The run's invariants then hold with no exemption: the master holds every submitted update
exactly once and every replica equals it. The real machines, the deterministic simulation.
A second scenario cuts the node off only briefly (it is back before the gap is given up) and slows
its catch-up: the parameter reply of its rejoin takes longer than twice the liveness timeout to arrive,
so the re-send under the old id comes after the controller would have given the gap up, had it not
waited for that node's catch-up.
Replay: ``PSRV_SIM_SEED=<seed> PSRV_SIM_TRACE=/tmp/trace.txt .venv/bin/python -m pytest <this file>``.
"""

from __future__ import annotations

import pytest
from psrv.server.updates import unbatch
from psrv.transport.messages import Message, Op

from sim.faults import Faults
from sim.injector import _heal
from sim.network import Process
from sim.roles import controller_available, real_setup
from sim.seeds import run_many, seed_list
from sim.world import Result, SimConfig, World

REASON = controller_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

DROP_AT_S = 0.6  # the mesh is running by then
CUT_AFTER_S = 0.12  # under two beats (0.1 s each): the node's own re-send has not run yet
CUT_FOR_S = 1.5  # the liveness timeout is 0.3 s; the gap is given up two timeouts after that
SHORT_CUT_S = 0.5  # offline at the controller after 0.3 s; back well before two timeouts after that
SLOW_REPLY_S = 1.0  # the rejoined node's download: more than twice the liveness timeout on its way


def _cut_off(world: World, target: Process, duration: float) -> None:
    pairs = set()
    for other in world.procs:
        if other is not target and other.live:
            pairs.update({(target.name, other.name), (other.name, target.name)})
    world.disturbed.add(target.slot)
    world.net.cut.update(pairs)
    world.note(f"cut {target.name} off for {duration:.3f}")
    world.sched.after(duration, _heal, world, sorted(pairs))


def _slow_catch_up(world: World, target: Process, old_id: int) -> None:
    """The first parameter reply to ``target`` under a new id waits ``SLOW_REPLY_S`` on its link."""
    done: list[bool] = []

    def delay(sender: Process, receiver: Process, message: Message) -> float:
        if done or receiver is not target or message.op is not Op.PARAMS_REPLY:
            return 0.0
        if target.role.member_id() in (None, old_id):
            return 0.0
        done.append(True)
        world.note(f"the catch-up download of {target.name} takes {SLOW_REPLY_S:.1f} s more")
        return SLOW_REPLY_S

    world.net.delay_if = delay


def _arm(world: World, slot: int, cut_for: float = CUT_FOR_S, slow: bool = False) -> None:
    """Lose every copy of the node's next own update (to the controller in PLAIN mode, to each
    neighbour in MESH mode), then cut the node off shortly after (and slow its catch-up)."""
    target = world.slots[slot]
    origin = target.role.member_id()
    chosen: list[int] = []  # the seqs of the first own update message it sends from now

    def own_update(sender: Process, receiver: Process, message: Message) -> bool:
        if sender is not target or message.op not in (Op.UPDATE, Op.UPDATES):
            return False
        seqs = [fields["seq"] for fields, _ in unbatch(message) if fields["origin"] == origin]
        if not seqs or (chosen and seqs != chosen):
            return False
        if not chosen:
            chosen.extend(seqs)
            world.note(f"losing {target.name}'s update(s) {seqs} on purpose")
            world.sched.after(CUT_AFTER_S, _cut_off, world, target, cut_for)
            if slow:
                _slow_catch_up(world, target, origin)
        return True

    world.net.drop_if = own_update


def run_gap(seed: int, mode: str = "plain", slow: bool = False) -> tuple[World, Result]:
    extra = {"mesh": mode, "fan_out": 2} if mode == "mesh" else {}
    nodes = 3 if mode == "plain" else 6
    cfg = SimConfig(nodes=nodes, model_size=64, duration_s=3.0, drain_s=10.0, update_every_s=(0.01, 0.03),
                    faults=Faults(), extra=extra)
    world = World(seed, real_setup(hostile=False), cfg)
    world.sched.at(DROP_AT_S, _arm, world, 0, SHORT_CUT_S if slow else CUT_FOR_S, slow)
    return world, world.run()


def _check_one(seed: int, mode: str) -> Result:
    world, result = run_gap(seed, mode)
    machine = world.controller.role.machine
    if not result.failures:  # the scenario happened as meant: a gap of the node was given up, it came back
        node = world.slots[0]
        if result.counts.counts["lost_on_purpose"] < 1:
            result.failures.append("the targeted update was not lost")
        elif machine.counters["departed_gaps_closed"] < 1:
            result.failures.append("the controller gave no gap up: the scenario did not happen")
        elif len(node.ids) < 2:
            result.failures.append(f"{node.name} did not come back under a new id: {node.ids}")
        elif node.role.machine.counters_["updates_renumbered_after_rejoin"] < 1:
            result.failures.append(f"{node.name} did not send a given-up update again")
    return result


@pytest.mark.parametrize("mode", ["plain", "mesh"])
def test_an_update_lost_just_before_a_long_cut_reaches_the_master_once(mode: str) -> None:
    first = 700_000 if mode == "plain" else 710_000
    run_many(seed_list(4, first=first), lambda s: _check_one(s, mode),
             f"tests/sim/test_given_up_gap.py::test_an_update_lost_just_before_a_long_cut_reaches_the_master_once[{mode}]")


def _check_slow(seed: int, mode: str) -> Result:
    world, result = run_gap(seed, mode, slow=True)
    if not result.failures:  # the scenario happened as meant: back in time, its download slowed, re-sent
        node = world.slots[0]
        counts = result.counts.counts
        if counts["lost_on_purpose"] < 1 or counts["delayed_on_purpose"] != 1:
            result.failures.append(f"the update was not lost or the download not slowed: {dict(counts)}")
        elif len(node.ids) < 2:
            result.failures.append(f"{node.name} did not come back under a new id: {node.ids}")
        elif node.role.machine.counters_["updates_resent_after_rejoin"] < 1:
            result.failures.append(f"{node.name} did not re-send the lost update under its old id")
        elif node.role.machine.counters_["updates_renumbered_after_rejoin"]:
            result.failures.append("the controller gave the gap up while the node caught up")
    return result


@pytest.mark.parametrize("mode", ["plain", "mesh"])
def test_an_update_lost_before_a_short_cut_survives_a_slow_catch_up(mode: str) -> None:
    first = 720_000 if mode == "plain" else 730_000
    run_many(seed_list(4, first=first), lambda s: _check_slow(s, mode),
             f"tests/sim/test_given_up_gap.py::test_an_update_lost_before_a_short_cut_survives_a_slow_catch_up[{mode}]")
