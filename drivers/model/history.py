"""The server's figures over a whole run, for pictures: each line keeps at most twice MOST points by dropping
every other one when full (amortised O(1) an append), so a day-long run costs what an hour's does."""

from __future__ import annotations

from dataclasses import dataclass, field

MOST = 1500  # a picture draws about this many points a line


@dataclass(slots=True)
class Line:
    """(time, value) points over the whole run, evenly thinned."""

    points: list[tuple[float, float]] = field(default_factory=list)
    step: int = 1  # keep one append in this many
    _skipped: int = 0

    def add(self, t: float, value: float) -> None:
        self._skipped += 1
        if self._skipped < self.step:
            return
        self._skipped = 0
        self.points.append((t, value))
        if len(self.points) >= 2 * MOST:
            del self.points[1::2]
            self.step *= 2


@dataclass(slots=True)
class ServerHistory:
    """The lines the timeline draws beneath its lanes (modelled times, as the fold's)."""

    kv: Line = field(default_factory=Line)
    hit: Line = field(default_factory=Line)  # the prefix cache's hit rate since the start
    running: Line = field(default_factory=Line)
    waiting: Line = field(default_factory=Line)
    gpu: Line = field(default_factory=Line)  # the GPUs' mean utilisation, percent
