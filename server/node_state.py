"""Small shared pieces of the node machine: its states and the submit-slot token."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum


class NodeState(StrEnum):
    JOINING = "joining"
    SYNCING = "syncing"
    RUNNING = "running"


class SlotToken:
    """The submit slots of own updates, given back once their frames reached every target socket.

    The machine creates it (no callback: it holds no hook); the facade binds the release function
    before the loop sees the ``Send`` that carries it. ``sent()`` on the machine's side (a target
    without a connection) returns True when that was the last target: the machine then says
    ``ReleaseSlots`` itself."""

    def __init__(self, targets: int, count: int) -> None:
        self.remaining, self.count = targets, count
        self._release: Callable[[int], None] | None = None

    def bind(self, release: Callable[[int], None]) -> None:
        self._release = release

    def sent(self) -> bool:
        self.remaining -= 1
        if self.remaining != 0:
            return False
        if self._release is not None:
            self._release(self.count)
        return True


__all__ = ["NodeState", "SlotToken"]
