"""The controller's departed members: their late updates still count for ``departed_kept_s`` (a
relay may still hold some), their gaps are given up a little earlier, then their per-origin state
is forgotten (ids are never reused)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["RETIRING_MAX", "DepartedMembers"]

RETIRING_MAX = 4096  # departed members whose state is kept at most, whatever departed_kept_s says


class DepartedMembers:
    """Departed member id -> when it departed, oldest first: ``retiring`` (its updates still count)
    and ``unclosed`` (its gaps not given up yet)."""

    def __init__(self) -> None:
        self.retiring: dict[int, float] = {}
        self.unclosed: dict[int, float] = {}

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.retiring

    def add(self, node_id: int, now: float) -> None:
        self.retiring[node_id] = now
        self.unclosed[node_id] = now

    def refresh(self, now: float, which: Callable[[int], bool]) -> None:
        """Keep the retiring members ``which`` accepts ``departed_kept_s`` from ``now`` (the process
        that held them joined again and may re-send what the master lacks); their gaps stay as they are."""
        for node_id in [i for i in self.retiring if which(i)]:
            del self.retiring[node_id]
            self.retiring[node_id] = now

    def reopened(self, origins: Iterable[int]) -> list[int]:
        """Those of ``origins`` whose gaps were given up already (a late update re-sent by a member)."""
        return sorted({o for o in origins if o in self.retiring and o not in self.unclosed})

    def gaps_due(self, now: float, close_after: float) -> list[int]:
        """The members whose gaps are given up now (no longer ``unclosed``), oldest first."""
        due = []
        for node_id, since in list(self.unclosed.items()):
            if now - since <= close_after:
                break
            del self.unclosed[node_id]
            due.append(node_id)
        return due

    def expired(self, now: float, kept: float) -> list[int]:
        """The members whose state is forgotten now (kept ``kept`` seconds, or too many), oldest first."""
        gone = []
        for node_id, since in list(self.retiring.items()):
            if now - since <= kept and len(self.retiring) <= RETIRING_MAX:
                break  # oldest first: the rest are younger
            del self.retiring[node_id]
            self.unclosed.pop(node_id, None)
            gone.append(node_id)
        return gone
