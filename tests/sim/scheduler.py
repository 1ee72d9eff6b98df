"""The seeded scheduler: one ``random.Random(seed)``, one event heap ordered by (time, sequence).

Everything random in a run (latencies, faults, workloads, hostile frames) draws from ``rng``, and
everything that happens is a callback taken off the heap in (time, insertion order): the same seed
gives the same run, step for step. ``note`` folds a description of each step into a digest, so a
test can assert that two runs of one seed are the same trace, not merely the same outcome.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any


class Scheduler:
    """A discrete-event clock: ``at``/``after`` schedule callbacks, ``run`` plays them in order."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.steps = 0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._digest = hashlib.blake2b(digest_size=16)

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at simulated time ``when`` (never before now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._order), fn, args))

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def run(self, until: float, max_steps: int | None = None) -> None:
        """Play every callback due up to ``until``; the clock then stands at ``until``."""
        heap = self._heap
        while heap and heap[0][0] <= until:
            when, _, fn, args = heapq.heappop(heap)
            self.now = when
            self.steps += 1
            if max_steps is not None and self.steps > max_steps:
                raise RuntimeError(f"seed {self.seed}: more than {max_steps} steps by t={when:.3f}")
            fn(*args)
        self.now = max(self.now, until)

    def pending(self) -> int:
        return len(self._heap)

    def note(self, text: str) -> None:
        """Fold one step's description into the trace digest."""
        self._digest.update(text.encode())
        self._digest.update(b"\n")

    def digest(self) -> str:
        return self._digest.hexdigest()
