"""--warmup: the start of a run left out of its figures (a time, or the first N arrivals), and the steady window
that follows it. The fold marks each finished turn with it once; goodput, the open-loop figures, the capacity
point, the live tally and the exporter all read that mark and the window's start."""

from __future__ import annotations

import re

import msgspec

from rampwatch.drivers.model.turns import TurnRecord

_WARMUP_TIME = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Warmup(msgspec.Struct, frozen=True):
    """--warmup: the start of a run left out of the goodput; a time (`60s`) or the first N arrivals (`3`)."""

    seconds: float | None = None
    conversations: int | None = None

    def excludes(self, rec: TurnRecord, order: int) -> bool:
        """Whether a turn falls in the warmup: due (else sent) before its end, or of one of the first N
        conversations (`order`: its session's place in arrival order, 1-based; 0 for one that is not a ramp's,
        the one-shot baseline)."""
        if self.seconds is not None:
            return rec.start_t < self.seconds
        return self.conversations is not None and 0 < order <= self.conversations

    def text(self) -> str:
        if self.seconds is not None:
            return f"the first {self.seconds:g}s"
        return f"the first {self.conversations} conversations"


def parse_warmup(text: str) -> Warmup:
    """'60s', '5m' -> a time; '3' -> the first 3 arrivals (conversations); ValueError otherwise."""
    t = text.strip().lower()
    if t.isdigit() and int(t) > 0:
        return Warmup(conversations=int(t))
    m = _WARMUP_TIME.match(t)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is neither a time (e.g. 60s, 5m) nor a number of arrivals (e.g. 3)")
    return Warmup(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])


class SteadyWindow:
    """Where the run's steady window starts, and which finished turns fall before it: the warmup's end for a time;
    for the first N arrivals, the earliest due (else sent) turn left in so far; the run's start without a warmup."""

    def __init__(self, warmup: Warmup | None = None):
        self.warmup = warmup
        # None: no turn past an N-arrivals warmup finished yet, so the window has not started.
        self.start: float | None = 0.0 if warmup is None else warmup.seconds

    def add(self, rec: TurnRecord, order: int) -> bool:
        """Fold a finished turn of the `order`th session to arrive; whether it falls in the warmup."""
        warm = self.warmup
        if warm is None:
            return False
        if warm.excludes(rec, order):
            return True
        if warm.conversations is not None:
            self.start = rec.start_t if self.start is None else min(self.start, rec.start_t)
        return False

    def minutes(self, end: float) -> float:
        """The window's length up to `end` (a window not yet started counts from the run's start)."""
        return max(0.0, end - (self.start or 0.0)) / 60
