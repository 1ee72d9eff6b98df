"""What can go wrong in one simulated run, drawn from the run's seed.

``Faults`` holds the probabilities of per-message faults (loss, duplication, reordering, jitter)
and the number of episodes of each process-level fault (partitions that heal, frozen processes,
crashes followed by a restart, clock jumps, graceful leaves that rejoin). ``Faults.draw`` picks a
profile for a seed so that thousands of seeds together cover every kind, alone and combined.
``FaultCounts`` is what a run actually injected: the report's coverage figures.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, fields


@dataclass
class Faults:
    loss: float = 0.0  # probability a message on a link is lost
    duplicate: float = 0.0  # probability it arrives twice
    reorder: float = 0.0  # probability it may overtake what was sent before it on its link
    jitter_s: float = 0.0  # extra latency, uniform in [0, jitter_s]
    partitions: int = 0  # episodes: a group of processes cut from the rest, then healed
    # lengths on both sides of the liveness timeout (0.35 s in the simulation's configuration): a node
    # cut off or frozen longer is evicted, rejoins under a new id and must still deliver its updates
    partition_s: tuple[float, float] = (0.1, 1.2)
    freezes: int = 0  # episodes: a process gets no ticks and no messages, then all at once
    freeze_s: tuple[float, float] = (0.1, 1.2)
    crashes: int = 0  # episodes: a node's machine is discarded; a fresh one joins later
    restart_s: tuple[float, float] = (0.05, 0.4)
    clock_jumps: int = 0  # episodes: one process's clock jumps forward
    jump_s: tuple[float, float] = (0.2, 3.0)
    leaves: int = 0  # episodes: a node stops cleanly (LEAVE) and a fresh one joins later
    hostile: int = 0  # hostile processes sending forged and fuzzed frames

    @classmethod
    def none(cls) -> Faults:
        return cls()

    @classmethod
    def draw(cls, rng: random.Random) -> Faults:
        """A random profile: each kind present with some probability, so seeds mix them."""
        f = cls()
        if rng.random() < 0.5:
            f.loss = rng.choice((0.001, 0.01, 0.05))
        if rng.random() < 0.4:
            f.duplicate = rng.choice((0.01, 0.05))
        if rng.random() < 0.4:
            f.reorder = rng.choice((0.02, 0.1))
        if rng.random() < 0.5:
            f.jitter_s = rng.choice((0.002, 0.01, 0.05))
        if rng.random() < 0.3:
            f.partitions = rng.randint(1, 2)
        if rng.random() < 0.3:
            f.freezes = rng.randint(1, 2)
        if rng.random() < 0.25:
            f.crashes = 1
        if rng.random() < 0.2:
            f.clock_jumps = 1
        if rng.random() < 0.15:
            f.leaves = 1
        if rng.random() < 0.3:
            f.hostile = 1
        return f

    def describe(self) -> str:
        parts = []
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, tuple) or not value:
                continue
            parts.append(f"{item.name}={value}")
        return " ".join(parts) or "no faults"


@dataclass
class FaultCounts:
    """What one run (or many, added up) injected and what the processes refused."""

    counts: Counter = field(default_factory=Counter)  # kind -> how many times injected
    rejected: Counter = field(default_factory=Counter)  # reason -> frames refused (decode or handler)
    runs: int = 0

    def add(self, other: FaultCounts) -> None:
        self.counts.update(other.counts)
        self.rejected.update(other.rejected)
        self.runs += other.runs

    def summary(self) -> str:
        injected = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        refused = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items()))
        return f"{self.runs} runs; injected: {injected or 'nothing'}; rejected: {refused or 'nothing'}"
