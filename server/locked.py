"""A role's machine as its I/O loop drives it: entered under the facade's lock.

The machines hold no lock; the facades (server/node.py, server/controller.py) own one that callers
also hold while they read or change the parameters. Every ``handle``, on the loop's thread or a
caller's, runs under it, with a time that never goes back between those threads. The actions that
touch the parameters (``Apply``, ``Install``) are carried out under the same lock, right after the
``handle`` that emitted them, so no caller ever sees a machine state ahead of its parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psrv.transport.events import Action, Event, Machine

__all__ = ["LockedMachine"]

Carry = Callable[[list[Action]], list[Action]]


class LockedMachine:
    """``machine.handle`` under ``lock``. ``under_lock`` (optional) carries out the actions that must
    happen under the lock (the parameters' effects) and returns the rest; ``after`` (optional) then
    carries out, outside the lock, the others meant for the facade and returns the loop's."""

    def __init__(
        self, machine: Machine, lock: Any, after: Carry | None = None, under_lock: Carry | None = None
    ) -> None:
        self.machine = machine
        self.lock = lock
        self.after = after
        self.under_lock = under_lock
        self.last_now = 0.0

    def handle(self, event: Event, now: float) -> list[Action]:
        with self.lock:
            self.last_now = now = max(now, self.last_now)
            actions = self.machine.handle(event, now)
            if self.under_lock is not None:
                actions = self.under_lock(actions)
        return actions if self.after is None else self.after(actions)
