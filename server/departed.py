"""The controller's departed members: their late updates still count for ``departed_kept_s`` (a
relay may still hold some), their gaps are given up a little earlier, then their per-origin state
is forgotten (ids are never reused).

The seqs given up are kept with the member (``given_up``): a parameter download tells them to the
process that held the id when it comes back, and it sends those it still holds again as new updates
of its new id (the old (origin, seq) would be refused now: the master's watermark covers it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["GIVEN_UP_MAX", "RETIRING_MAX", "DepartedMembers"]

RETIRING_MAX = 4096  # departed members whose state is kept at most, whatever departed_kept_s says
GIVEN_UP_MAX = 4096  # given-up seqs remembered per departed member (a gap is a few lost messages)


class DepartedMembers:
    """Departed member id -> when it departed, oldest first: ``retiring`` (its updates still count)
    and ``unclosed`` (its gaps not given up yet)."""

    def __init__(self) -> None:
        self.retiring: dict[int, float] = {}
        self.unclosed: dict[int, float] = {}
        self.given_up: dict[int, list[int]] = {}  # member -> the seqs of its gaps given up, sorted

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.retiring

    def add(self, node_id: int, now: float) -> None:
        self.retiring[node_id] = now
        self.unclosed[node_id] = now

    def refresh(self, now: float, which: Callable[[int], bool]) -> None:
        """Keep the retiring members ``which`` accepts ``departed_kept_s`` from ``now`` (the process
        that held them joined again and may re-send what the master lacks); the gaps not given up yet
        wait as long again from ``now``: its catch-up re-sends them under their own (origin, seq)."""
        for node_id in [i for i in self.retiring if which(i)]:
            del self.retiring[node_id]
            self.retiring[node_id] = now
            if node_id in self.unclosed:
                del self.unclosed[node_id]
                self.unclosed[node_id] = now

    def gave_up(self, node_id: int, seqs: list[int]) -> None:
        """``seqs`` of a departed member were given up (they will never be applied under its id)."""
        if node_id in self.retiring and seqs:
            kept = sorted(set(self.given_up.get(node_id, ())) | set(seqs))
            self.given_up[node_id] = kept[:GIVEN_UP_MAX]

    def given_up_view(self, which: Callable[[int], bool]) -> dict[int, list[int]]:
        """Per retiring member ``which`` accepts (the ids the asking process may have held): the seqs
        given up, newest departures first, at most ``GIVEN_UP_MAX`` in all (a parameter reply stays small)."""
        view: dict[int, list[int]] = {}
        room = GIVEN_UP_MAX
        for node_id in reversed(self.given_up):
            seqs = self.given_up[node_id]
            if room <= 0:
                break
            if which(node_id):
                view[node_id] = seqs[:room]
                room -= len(view[node_id])
        return view

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
            self.given_up.pop(node_id, None)
            gone.append(node_id)
        return gone
