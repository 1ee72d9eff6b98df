"""A role's machine as its I/O loop drives it: entered under the facade's lock.

The machines hold no lock; the facades (server/node.py, server/controller.py) own one that callers
also hold while they read or change the parameters. Every ``handle``, on the loop's thread or a
caller's, runs under it, with a time that never goes back between those threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psrv.transport.events import Action, Event, Machine

__all__ = ["LockedMachine"]


class LockedMachine:
    """``machine.handle`` under ``lock``; ``after`` (optional) carries out the actions meant for the
    facade and returns the rest, for the loop."""

    def __init__(
        self, machine: Machine, lock: Any, after: Callable[[list[Action]], list[Action]] | None = None
    ) -> None:
        self.machine = machine
        self.lock = lock
        self.after = after
        self.last_now = 0.0

    def handle(self, event: Event, now: float) -> list[Action]:
        with self.lock:
            self.last_now = now = max(now, self.last_now)
            actions = self.machine.handle(event, now)
        return actions if self.after is None else self.after(actions)
