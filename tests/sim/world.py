"""One simulated run: a controller and N nodes (plus hostile members) over the simulated network.

``World(seed, setup, config).run()`` starts the machines, ticks each every 10-50 ms of simulated
time, submits tau-scaled sparse updates from every node, injects the seed's faults, then calms the
network (no more faults, partitions healed) and lets it drain until every live replica equals the
master, and returns a ``Result`` with the invariant violations (``sim.invariants``), the trace digest
and the fault counts. The harness calls ``machine.handle`` directly: any exception other than
FrameRejectedError (a counted rejection) is recorded as a failure with the seed.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from psrv.encoding import sparse_message
from psrv.transport.errors import FrameRejectedError
from psrv.transport.events import Event, Received, Reply, Started, Submit, Tick

from sim.faults import FaultCounts, Faults
from sim.network import BudgetExceeded, Network, Process
from sim.scheduler import Scheduler

TAU_BASE = 0.01
TAU_STEP = 2.0**-20  # every update gets its own tau: its payload bytes name it


@dataclass
class SimConfig:
    nodes: int = 4
    model_size: int = 128
    dtype: str = "float64"
    duration_s: float = 1.5  # updates flow and faults happen in [0, duration_s]
    drain_s: float = 8.0  # then at most this long for everything to converge
    settle_every_s: float = 0.25
    tick_s: tuple[float, float] = (0.01, 0.05)
    update_every_s: tuple[float, float] = (0.02, 0.1)
    join_at_s: tuple[float, float] = (0.0, 0.2)  # when each node starts
    hostile_every_s: tuple[float, float] = (0.01, 0.05)
    bound: int = 64
    max_mesh_per_node: int | None = None  # budget: MESH messages one process may receive in a run
    submitters: int | None = None  # only the first this many node slots submit updates (None: all)
    chunk_bytes: int = 16 * 1024 * 1024
    download_chunk_bytes: int = 512  # parameter downloads travel in CHUNKs (reassembled like the loop)
    faults: Faults = field(default_factory=Faults)
    max_steps: int = 5_000_000
    extra: dict[str, Any] = field(default_factory=dict)  # passed to the role factories


class Hooks:
    """What a role reports to the harness: an update applied (payload, header), a download installed."""

    def __init__(self, world: World, proc: Process) -> None:
        self.world, self.proc = world, proc

    def applied(self, payload: Any, header: dict) -> None:
        self.world.on_applied(self.proc, payload, header)

    def installed(self) -> None:
        self.world.on_installed(self.proc)


@dataclass
class Setup:
    """How to build the roles of a run: the real machines (sim.roles) or the toy (sim.toy)."""

    controller: Callable[[Hooks, str, SimConfig], Any]  # (hooks, address, config)
    node: Callable[
        [Hooks, str, str, str, SimConfig], Any
    ]  # (hooks, address, controller address, name, config)
    hostile: Callable[[World, Process], Any] | None = None
    # a node back under a new id re-sends what the master lacks (the real machines; the toy does not)
    resends_after_rejoin: bool = True


@dataclass
class Submission:
    uid: int
    proc: Process
    at: float
    indices: np.ndarray
    values: np.ndarray


@dataclass
class Result:
    seed: int
    failures: list[str]
    digest: str
    counts: FaultCounts
    stats: Counter
    profile: str = ""  # the faults drawn for this run

    def check(self, replay: str = "tests/sim") -> None:
        if self.failures:
            head = "\n".join(self.failures[:8])
            raise AssertionError(
                f"seed {self.seed} ({self.profile}): {len(self.failures)} invariant violation(s):\n{head}\n"
                f"replay: PSRV_SIM_SEED={self.seed} .venv/bin/python -m pytest {replay}"
            )


def _summary(fields: dict) -> str:
    """Scalars as they are, containers by size: cheap, and still different when a run differs."""
    return " ".join(
        f"{k}={v!r:.40}" if isinstance(v, int | float | str | bool | None) else f"{k}#{len(v)}"
        for k, v in fields.items()
    )


def describe(event: Any) -> str:
    """One line per event or action, for the trace digest (and PSRV_SIM_TRACE)."""
    kind = type(event).__name__
    message = getattr(event, "message", None)
    if isinstance(event, Received):
        rid = event.routing_id.hex() if event.routing_id else "-"
        where = f"src={message.src} rid={rid} via={event.via}"
        return f"Received {message.op.value} {where} {_summary(message.fields)}"
    if message is not None and hasattr(event, "to"):  # Send, Download
        return f"{kind} to={event.to} {message.op.value} {_summary(message.fields)}"
    if isinstance(event, Reply):
        return f"Reply {event.routing_id.hex()} {message.op.value} {_summary(message.fields)}"
    if isinstance(event, Submit):
        return f"Submit {sorted(event.fields)} slot={event.slot} more={event.more}"
    if kind == "Stop":
        return f"Stop {event.error!r:.200}"
    if kind == "Apply":
        return f"Apply {len(event.payloads)}"
    if kind == "Install":
        return "Install"
    return repr(event)[:200]


def _told(action: Any) -> None:
    token = getattr(action, "token", None)
    sent = getattr(token, "sent", None)
    if sent is not None:
        sent()


class World:
    def __init__(self, seed: int, setup: Setup, config: SimConfig) -> None:
        self.seed = seed
        self.setup = setup
        self.config = config
        self.sched = Scheduler(seed)
        self.counts = FaultCounts(runs=1)
        self.net = Network(
            self.sched,
            config.faults,
            self.counts,
            self.deliver,
            bound=config.bound,
            chunk_bytes=config.chunk_bytes,
        )
        self.failures: list[str] = []
        self.stats: Counter = Counter()
        self.procs: list[Process] = []
        self.slots: dict[int, Process] = {}
        self.controller: Process | None = None
        self.hostiles: list[Process] = []
        self.disturbed: set[int] = set()  # slots a fault touched (a rejoin there is explained)
        self.subs: list[Submission] = []
        self.by_payload: dict[bytes, Submission] = {}
        self.master_applied: Counter = Counter()
        self.node_applied: dict[str, Counter] = {}
        self.initial = np.zeros(config.model_size, dtype=config.dtype)
        self.calm = False
        self._serial = 0
        # every step as text, kept when PSRV_SIM_TRACE names a file (written there after the run)
        self.trace: list[str] | None = [] if os.environ.get("PSRV_SIM_TRACE") else None

    # ------------------------------------------------------------------ processes
    def _new_process(self, name: str, kind: str, slot: int) -> Process:
        self._serial += 1
        routing_id = self.sched.rng.randbytes(5)
        while routing_id in self.net.by_routing:
            routing_id = self.sched.rng.randbytes(5)
        proc = Process(name, kind, slot, routing_id, f"sim-{self._serial}:{7000 + self._serial}")
        self.procs.append(proc)
        self.net.attach(proc)
        return proc

    def _adopt_routing_id(self, proc: Process) -> None:
        """A machine that picks its own routing id (from the seeded random_bytes) names its process."""
        rid = getattr(proc.role, "routing_id", None) or getattr(proc.role.machine, "routing_id", None)
        if isinstance(rid, bytes) and rid != proc.routing_id:
            if self.net.by_routing.get(proc.routing_id) is proc:
                del self.net.by_routing[proc.routing_id]
            proc.routing_id = rid
            self.net.by_routing[rid] = proc

    def start_controller(self) -> None:
        proc = self._new_process("ctl", "controller", -1)
        proc.role = self.setup.controller(Hooks(self, proc), proc.address, self.config)
        self._adopt_routing_id(proc)
        self.controller = proc
        self._boot(proc)

    def start_node(self, slot: int) -> None:
        generation = sum(1 for p in self.procs if p.slot == slot and p.kind == "node")
        name = f"n{slot}" if not generation else f"n{slot}.{generation}"
        proc = self._new_process(name, "node", slot)
        self.node_applied[name] = Counter()
        proc.role = self.setup.node(
            Hooks(self, proc), proc.address, self.controller.address, f"node-{slot}", self.config
        )
        self._adopt_routing_id(proc)
        self.slots[slot] = proc
        self._boot(proc)

    def start_hostile(self, index: int) -> None:
        proc = self._new_process(f"h{index}", "hostile", -2 - index)
        proc.role = self.setup.hostile(self, proc)
        self.hostiles.append(proc)
        self._boot(proc)

    def _boot(self, proc: Process) -> None:
        self.handle(proc, Started(proc.address))
        self._schedule_tick(proc)

    def _schedule_tick(self, proc: Process) -> None:
        self.sched.after(self.sched.rng.uniform(*self.config.tick_s), self._tick, proc)

    def _tick(self, proc: Process) -> None:
        if not proc.live:
            return
        if proc.frozen_until <= self.sched.now:
            self.handle(proc, Tick())
        self._schedule_tick(proc)

    # ------------------------------------------------------------------ events and actions
    def deliver(self, proc: Process, event: Event) -> None:
        if not proc.live:
            return
        if proc.frozen_until > self.sched.now:
            proc.held.append(("event", event))
            return
        self.handle(proc, event)

    def handle(self, proc: Process, event: Event) -> None:
        now = max(self.sched.now + proc.clock_offset, proc.last_now)
        proc.last_now = now
        self.note(f"{now:.6f} {proc.name} {describe(event)}")
        try:
            actions = proc.role.machine.handle(event, now)
        except FrameRejectedError as exc:
            self.net.reject(proc, exc.reason)
            return
        except Exception as exc:  # noqa: BLE001 - the point of the harness: report it with the seed
            tb = "".join(traceback.format_exception(exc, limit=-4))
            self.fail(f"{proc.name} raised {type(exc).__name__}: {exc} on {describe(event)}\n{tb}")
            return
        if proc.kind == "node":
            member = proc.role.member_id()
            if member is not None and (not proc.ids or proc.ids[-1] != member):
                proc.ids.append(member)
        for action in actions:
            self.act(proc, action)

    def act(self, proc: Process, action: Any) -> None:
        self.note(f"  -> {proc.name} {describe(action)}")
        kind = type(action).__name__  # by name: the vocabulary grows on the machines' branches
        if kind == "Send":
            self.net.send(proc, action.to, action.message, action.droppable, action.count)
            _told(action)
        elif kind == "Download":  # paced pieces in the loop; here CHUNKs of chunk_bytes on the data link
            self.net.send(proc, action.to, action.message, False, 1, self.config.download_chunk_bytes)
            _told(action)
        elif kind == "Reply":
            self.net.reply(proc, action.routing_id, action.message)
        elif kind == "Connect":
            self.net.connect(
                proc,
                action.peer,
                action.address,
                getattr(action, "routing_id", None),
                getattr(action, "listen", True),
            )
        elif kind == "Disconnect":
            proc.connections.pop(action.peer, None)
        elif kind in ("ReleaseSlots", "Notify"):  # the facade's (the submit queue, waiting callers)
            pass
        elif kind in ("Apply", "Install"):  # the facade's, on the parameters: the role carries them out
            proc.role.carry_out(action)
        elif kind == "Ready":
            self.stats[f"ready_{proc.kind}"] += 1
        elif kind == "Stop":
            proc.stopped = True
            proc.stop_error = action.error
            self.net.detach(proc)
            self.stats[f"stop_{proc.kind}"] += 1
            if proc.kind == "node" and not getattr(proc, "leaving", False):
                self.fail(f"{proc.name} stopped by itself: {action.error!r}")
            if proc.kind == "controller":
                self.fail(f"the controller stopped: {action.error!r}")
        else:
            self.fail(f"{proc.name} returned an unknown action {action!r:.200}")

    def note(self, text: str) -> None:
        self.sched.note(text)
        if self.trace is not None:
            self.trace.append(text)

    def fail(self, text: str) -> None:
        self.failures.append(f"[t={self.sched.now:.3f}] {text}")

    # ------------------------------------------------------------------ updates
    def _submit_loop(self, slot: int) -> None:
        if self.sched.now > self.config.duration_s:
            return
        proc = self.slots.get(slot)
        if proc is not None and proc.live and proc.frozen_until <= self.sched.now:
            self.submit(proc)
        self.sched.after(self.sched.rng.uniform(*self.config.update_every_s), self._submit_loop, slot)

    def new_update(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng, n = self.sched.rng, self.config.model_size
        count = rng.randint(1, max(1, n // 16 - 1))
        indices = np.array(sorted(rng.sample(range(n), count)), dtype=np.int64)
        negative = np.array([rng.random() < 0.5 for _ in range(count)], dtype=bool)
        tau = float(np.float32(TAU_BASE + (len(self.subs) + 1) * TAU_STEP))
        payload = sparse_message(indices, negative, n, tau)
        values = np.where(negative, -tau, tau).astype(self.config.dtype)
        return payload, indices, values

    def submit(self, proc: Process) -> None:
        """One update from ``proc``'s training loop: the role applies it locally and returns the
        events that send it (none while the node is joining: it waits in the backlog), or None when
        it refuses it (a stopped node)."""
        payload, indices, values = self.new_update()
        sub = Submission(len(self.subs) + 1, proc, self.sched.now, indices, values)
        self.subs.append(sub)
        self.by_payload[payload.tobytes()] = sub
        events = proc.role.submit(payload)
        if events is None:
            self.subs.pop()
            del self.by_payload[payload.tobytes()]
            self.stats["submit_refused"] += 1
            return
        for event in events:
            self.handle(proc, event)

    def on_applied(self, proc: Process, payload: Any, header: dict) -> None:
        data = payload.tobytes() if isinstance(payload, np.ndarray) else bytes(payload)
        sub = self.by_payload.get(data)
        if sub is None:
            self.fail(f"{proc.name} applied an update nobody submitted: {dict(header)!r:.200}")
            return
        if proc.kind == "controller":
            self.master_applied[sub.uid] += 1
            if self.master_applied[sub.uid] > 1:
                self.fail(f"the master applied update {sub.uid} ({sub.proc.name}, {header!r:.120}) twice")
        else:
            applied = self.node_applied[proc.name]
            applied[sub.uid] += 1
            if applied[sub.uid] > 1:
                self.fail(
                    f"{proc.name} applied update {sub.uid} ({sub.proc.name}) twice since its last download"
                )

    def on_installed(self, proc: Process) -> None:
        self.node_applied[proc.name].clear()
        self.stats["installs"] += 1

    def expected_master(self) -> np.ndarray:
        expected = self.initial.copy()
        for sub in self.subs:
            times = self.master_applied.get(sub.uid, 0)
            if times:
                np.add.at(expected, sub.indices, sub.values * times)
        return expected

    # ------------------------------------------------------------------ the run
    def run(self) -> Result:
        from sim import injector, invariants

        cfg = self.config
        self.start_controller()
        burst, burst_at = cfg.extra.get("burst", (0, 0.0))
        for slot in range(cfg.nodes):
            at = self.sched.rng.uniform(*cfg.join_at_s)
            if slot >= cfg.nodes - burst:  # a join burst: these all start within 10 ms, updates flowing
                at = burst_at + self.sched.rng.uniform(0.0, 0.01)
            self.sched.at(at, self.start_node, slot)
            if cfg.submitters is None or slot < cfg.submitters:
                self.sched.at(at + 0.001, self._submit_loop, slot)
        if self.setup.hostile is not None:
            for index in range(cfg.faults.hostile):
                self.sched.at(self.sched.rng.uniform(0.05, 0.3), self.start_hostile, index)
        injector.schedule_faults(self)
        self.net.max_mesh_per_process = cfg.max_mesh_per_node
        try:
            self.sched.run(cfg.duration_s, cfg.max_steps)
            self.calm_down()
            end = cfg.duration_s + cfg.drain_s
            while self.sched.now < end:
                self.sched.run(min(end, self.sched.now + cfg.settle_every_s), cfg.max_steps)
                if invariants.converged(self):
                    break
        except BudgetExceeded as exc:
            self.fail(f"budget exceeded, run stopped: {exc}")
        else:
            self.failures.extend(invariants.check(self))
        self.stats["sim_time_ms"] = int(self.sched.now * 1000)
        self.stats["steps"] = self.sched.steps
        self.failures.extend(self.net.codec_errors)
        for proc in self.procs:  # what the machines refused themselves (they count, never raise)
            refused = getattr(proc.role, "rejected", None)
            if refused is not None:
                self.counts.rejected.update(refused())
        if self.trace is not None:
            with open(os.environ["PSRV_SIM_TRACE"], "w") as out:
                out.write("\n".join(self.trace) + "\n")
        return Result(
            self.seed,
            self.failures,
            self.sched.digest(),
            self.counts,
            self.stats,
            self.config.faults.describe(),
        )

    def calm_down(self) -> None:
        """The end of the faults: no more loss, duplication, reordering or jitter; partitions heal."""
        self.calm = True
        self.net.faults = Faults()
        self.net.cut.clear()
