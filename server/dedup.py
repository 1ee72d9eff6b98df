"""Exactly-once apply of relayed updates, with bounded memory.

Every update carries ``(origin, seq)``: the origin node's id and its sequence number, which
starts at 1 and grows by 1 per update. A node may receive the same update along several paths
(or again after a remap), and updates of one origin may arrive out of order.

Policy, per origin:

- ``watermark`` W: every seq <= W has been seen (or given up on, see below). Starts at 0.
- a set of seen seqs above W (out-of-order arrivals); it never holds more than ``window`` items.
- ``first_time(origin, seq)`` is True exactly once per (origin, seq) and False for
  - a seq seen before (a duplicate), or a seq <= W (seen, or covered by a catch-up download);
- a seq more than ``window`` above W slides the window: W jumps to ``seq - window`` and the seqs
  skipped that way never arrived in time (counted in ``skipped``); if they come later they are
  refused as too old, like duplicates. With the default window of 65 536 that only happens when an origin's
  updates are reordered by more than 65 536 places, which the runtime's bounded queues exclude.

Memory is therefore O(number of origins * window) at worst and O(number of origins) in the
usual in-order case. ``mark_covered`` raises watermarks after a catch-up download: the
downloaded parameters already include every update at or below it.

Catch-up protocol for the runtime: subscribe first and HOLD what arrives during the download
(do not pass it to ``first_time`` yet: applied to parameters the download then replaces, it
would be lost); after the download call ``mark_covered(W)``, then feed the held updates and the
live stream through ``first_time``: those <= W are refused, those > W are applied once.
"""

from __future__ import annotations

__all__ = ["SeenUpdates"]

from psrv.transport.errors import InvalidSequenceError


class _Origin:
    __slots__ = ("mark", "above", "top")

    def __init__(self) -> None:
        self.mark = 0
        self.above: set[int] = set()
        self.top = 0  # the highest seq seen or covered

    def advance(self) -> None:
        """Move the watermark over every contiguous seq already seen above it."""
        above = self.above
        if not above:
            return
        mark = self.mark
        while mark + 1 in above:
            mark += 1
            above.discard(mark)
        self.mark = mark

    def raise_to(self, mark: int) -> None:
        if mark <= self.mark:
            return
        self.mark = mark
        self.top = max(self.top, mark)
        if self.above:
            self.above = {s for s in self.above if s > mark}
            self.advance()


def _check(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidSequenceError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class SeenUpdates:
    """Which (origin, seq) updates were already applied; see the module docstring for the policy."""

    def __init__(self, window: int = 65536):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.window = window
        self._origins: dict[int, _Origin] = {}
        self.duplicates = 0  # refused: seen before, or at/below the watermark (too old)
        self.skipped = 0  # seqs given up on (never seen) because the window slid past them

    def first_time(self, origin: int, seq: int) -> bool:
        """True once per (origin, seq), which is then marked seen; False for a duplicate or too old."""
        _check("origin", origin, 0)
        _check("seq", seq, 1)
        state = self._origins.get(origin)
        if state is None:
            state = self._origins[origin] = _Origin()
        mark = state.mark
        if seq == mark + 1 and not state.above:  # the usual, in-order case
            state.mark = state.top = seq
            return True
        if seq <= mark:
            self.duplicates += 1
            return False
        if seq in state.above:
            self.duplicates += 1
            return False
        if seq > mark + self.window:
            floor = seq - self.window
            held = sum(1 for s in state.above if s <= floor)
            self.skipped += floor - mark - held
            state.raise_to(floor)
        state.above.add(seq)
        if seq > state.top:
            state.top = seq
        state.advance()
        return True

    def too_far(self, origin: int, seq: int) -> bool:
        """Is ``seq`` more than ``window`` above the highest seq of a known origin? An origin numbers
        its updates 1, 2, 3 …, so only a forged sequence number jumps that far (accepted, it would
        slide the window and drop the origin's real updates as too old); the runtime refuses it."""
        state = self._origins.get(origin)
        return state is not None and seq > state.top + self.window

    def gaps(self, origin: int, limit: int = 65536) -> list[int]:
        """The seqs of ``origin`` between its watermark and its highest seq that were never seen (at
        most ``limit``, lowest first): what ``close`` would give up."""
        state = self._origins.get(origin)
        if state is None or not state.above:
            return []
        out = []
        for seq in range(state.mark + 1, state.top):
            if seq not in state.above:
                out.append(seq)
                if len(out) >= limit:
                    break
        return out

    def close(self, origin: int) -> int:
        """Give up on an origin's gaps: every seq up to the highest seen counts as seen from now on
        (it departed, and its late copies had time to arrive: nobody will send the missing ones).
        Returns how many seqs were given up on (counted in ``skipped`` too)."""
        state = self._origins.get(origin)
        if state is None or not state.above:
            return 0
        gaps = state.top - state.mark - len(state.above)
        self.skipped += gaps
        state.raise_to(state.top)
        return gaps

    def forget(self, origin: int) -> None:
        """Drop an origin's state (it departed and its updates are folded into the master copy)."""
        self._origins.pop(origin, None)

    def seen(self, origin: int, seq: int) -> bool:
        """Whether (origin, seq) counts as seen, without marking anything."""
        state = self._origins.get(origin)
        if state is None:
            return False
        return seq <= state.mark or seq in state.above

    def watermark(self) -> dict[int, int]:
        """Per origin: the highest seq such that every seq at or below it was seen (a copy)."""
        return {origin: state.mark for origin, state in self._origins.items()}

    def top_of(self, origin: int) -> int:
        """The highest seq of ``origin`` seen or covered (0 for an origin never seen)."""
        state = self._origins.get(origin)
        return 0 if state is None else state.top

    def watermark_of(self, origin: int) -> int:
        """``watermark()[origin]`` (0 for an origin never seen), without copying every origin's."""
        state = self._origins.get(origin)
        return 0 if state is None else state.mark

    def mark_covered(self, watermark: dict[int, int]) -> None:
        """After a catch-up download: everything at or below ``watermark[origin]`` counts as seen."""
        for origin, mark in dict(watermark).items():
            _check("origin", origin, 0)
            _check("watermark", mark, 0)
            state = self._origins.get(origin)
            if state is None:
                state = self._origins[origin] = _Origin()
            state.raise_to(mark)

    def above_watermark(self) -> dict[int, list[int]]:
        """Per origin that has any: the sorted seqs seen above its watermark (out-of-order arrivals).

        With ``watermark()`` this describes the seen set exactly, e.g. for a parameter download
        that must say precisely which updates the parameters include.
        """
        return {origin: sorted(state.above) for origin, state in self._origins.items() if state.above}

    def pending(self, origin: int) -> int:
        """How many out-of-order seqs above the watermark are held for ``origin`` (memory check)."""
        state = self._origins.get(origin)
        return 0 if state is None else len(state.above)

    def origins(self) -> list[int]:
        return sorted(self._origins)
