"""Small shared pieces of the node machine: its states and the submit-slot token."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum


class NodeState(StrEnum):
    JOINING = "joining"
    SYNCING = "syncing"
    RUNNING = "running"


class SlotToken:
    """Releases the submit slots of own updates once their frames reached every target socket."""

    def __init__(self, targets: int, count: int, release: Callable[[int], None]) -> None:
        self.remaining, self.count, self._release = targets, count, release
        if targets == 0:
            release(count)

    def sent(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self._release(self.count)


__all__ = ["NodeState", "SlotToken"]
