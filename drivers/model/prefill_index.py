"""Which sessions' prefills a batch of token times can overlap: each session's newest prefill span's end (inf
while in flight), so a batch looks only at the sessions whose spans reach into it, not at every session
(O(sessions) per batch was 5 ms a pass at 64 sessions), and the ended ones no batch can reach are forgotten now
and then (a trace's thousands of finished sessions would otherwise be walked on every batch)."""

from __future__ import annotations

import math

from rampwatch.drivers.model.views import SessionView

PRUNE_EVERY = 256  # batches between two prunings of the ended prefills


class PrefillIndex:
    def __init__(self) -> None:
        self._ends: dict[str, float] = {}
        self._batches = 0

    def began(self, session: str) -> None:
        self._ends[session] = math.inf

    def ended(self, session: str, t: float) -> None:
        self._ends[session] = t

    def others_overlapping(
        self, sessions: dict[str, SessionView], session: str, lo: float, hi: float, now: float
    ) -> list[tuple[float, float | None]]:
        """The prefill spans of sessions other than `session` that overlap [lo, hi]."""
        self._batches += 1
        if self._batches % PRUNE_EVERY == 0:
            self._prune(sessions, now)
        return [
            sp
            for sid, end in self._ends.items()
            if end > lo and sid != session
            for sp in sessions[sid].prefills_overlapping(lo, hi)
        ]

    def _prune(self, sessions: dict[str, SessionView], now: float) -> None:
        """Forget the prefills that ended before any batch still to come can start: before every turn in flight's
        last token (or its send) and before now."""
        floor = now
        for s in sessions.values():
            if (rec := s.current) is not None:
                floor = min(floor, rec.last_t if rec.last_t is not None else rec.sent_t)
        self._ends = {sid: end for sid, end in self._ends.items() if end > floor}
