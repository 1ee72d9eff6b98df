"""The controller's departed members: their late updates still count for ``departed_kept_s`` (a
relay may still hold some), their gaps are given up a little earlier, then their per-origin state
is forgotten (ids are never reused).

The seqs given up are kept with the member (``given_up``): a parameter download tells them to the
process that held the id when it comes back, and it sends those it still holds again as new updates
of its new id (the old (origin, seq) would be refused now: the master's watermark covers it).

While that process is back but still catching up, its old ids' gaps are ``held``: its download may
have left before they were given up (and so not list them), and the re-send under the old (origin,
seq) it then makes must still be accepted, however slow the download. They wait until it reports the
catch-up done, then as long again as after a departure (a re-send in flight, or lost and repeated by
the beat repairs); at most ``held_at_most`` from the rejoin, so a process that never catches up does
not keep them open."""

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
        self.held: dict[int, int] = {}  # member -> the live member (its process) whose catch-up it awaits

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.retiring

    def add(self, node_id: int, now: float, holder: int | None = None) -> None:
        """``node_id`` departed now; ``holder``: its process is back already (a new id, catching up)."""
        self.retiring[node_id] = now
        self.unclosed[node_id] = now
        if holder is not None:
            self.held[node_id] = holder

    def refresh(self, now: float, which: Callable[[int], bool], holder: int | None = None) -> None:
        """Keep the retiring members ``which`` accepts ``departed_kept_s`` from ``now`` (the process
        that held them joined again and may re-send what the master lacks); the gaps not given up yet
        wait as long again from ``now``: its catch-up re-sends them under their own (origin, seq). With
        ``holder`` (that process's new id, still catching up) they are held until ``caught_up``."""
        for node_id in [i for i in self.retiring if which(i)]:
            del self.retiring[node_id]
            self.retiring[node_id] = now
            if node_id in self.unclosed:
                del self.unclosed[node_id]
                self.unclosed[node_id] = now
                if holder is not None:
                    self.held[node_id] = holder

    def holds(self, holder: int) -> bool:
        """Do some gaps wait for ``holder``'s catch-up?"""
        return bool(self.held) and holder in self.held.values()

    def caught_up(self, holder: int, now: float) -> None:
        """``holder`` installed its download and sent what its old ids owed: their gaps wait as long
        again from ``now`` (that re-send may still be on its way, or lost and repeated)."""
        ids = {i for i, h in self.held.items() if h == holder}
        for node_id in ids:
            del self.held[node_id]
        self.refresh(now, lambda i: i in ids)

    def released(self, holder: int) -> None:
        """``holder`` left before it caught up: the gaps it held wait no longer for it."""
        for node_id in [i for i, h in self.held.items() if h == holder]:
            del self.held[node_id]

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

    def gaps_due(self, now: float, close_after: float, held_at_most: float) -> list[int]:
        """The members whose gaps are given up now (no longer ``unclosed``), oldest first: ``close_after``
        since they departed or were refreshed, ``held_at_most`` when held for a catch-up."""
        due = []
        for node_id, since in list(self.unclosed.items()):
            if now - since <= close_after:
                break  # oldest first: the rest are younger
            if node_id in self.held and now - since <= held_at_most:
                continue
            del self.unclosed[node_id]
            self.held.pop(node_id, None)
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
            self.held.pop(node_id, None)
            gone.append(node_id)
        return gone
