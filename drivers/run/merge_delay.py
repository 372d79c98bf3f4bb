"""How long the coordinator of --workers N holds events back to merge the workers' in time order (EventHub.hold).

A worker's lines come a batch at a time, a few tens of ms after their events: HOLD_S covers that. A coordinator
that falls behind (a flood of tokens from every worker on the cores it shares with them) reads each worker's
lines seconds late, and a fixed hold would then release one worker's events before another's older ones: the
fold would miss another session's prefill when it classed a gap. So the hold grows to the lateness seen in the
last second or two, and shrinks back once the lines come in on time; it is capped, so memory stays bounded."""

from __future__ import annotations

HOLD_S = 0.25  # the hold while the workers' lines come in on time
MAX_HOLD_S = 10.0  # the longest hold, however late the lines come: a coordinator further behind reorders
WINDOW_S = 1.0  # the lateness kept is the worst of this window and the one before


class MergeDelay:
    """The hold: HOLD_S, or the worst lateness of the workers' events lately plus a margin, at most MAX_HOLD_S."""

    def __init__(self) -> None:
        self._worst = 0.0  # the current window's worst lateness
        self._before = 0.0  # ... the window before's
        self._ends = 0.0

    def note(self, late_s: float, now: float) -> None:
        """A worker's event, `late_s` after its time, read at `now` (the run's clock)."""
        self._turn(now)
        self._worst = max(self._worst, late_s)

    def late_s(self, now: float) -> float:
        """How late the workers' events came lately: the worst of this window and the one before."""
        self._turn(now)
        return max(self._worst, self._before)

    def hold_s(self, now: float) -> float:
        return min(MAX_HOLD_S, max(HOLD_S, self.late_s(now) + HOLD_S / 2))

    def _turn(self, now: float) -> None:
        if now >= self._ends:
            gap = now - self._ends  # a window with no event noted between: its worst was nothing
            self._before = self._worst if gap < WINDOW_S else 0.0
            self._worst, self._ends = 0.0, now + WINDOW_S
