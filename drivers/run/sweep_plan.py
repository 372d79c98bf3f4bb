"""What an open-loop sweep runs: its rates, or the points of sweep --find-max's search for the knee, the
highest arrival rate whose turns still meet the SLO often enough. Pure bookkeeping (which rate to try next,
given which passed), so it is tested without a server.

The bracket's ends run first: a low end that fails halves downwards, a high end that passes doubles upwards,
until a passing rate lies below a failing one; then each point bisects the bracket geometrically (rates span
orders of magnitude, and a capacity is a ratio), until the points run out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class KneeSearch:
    low: float  # rates in any unit, all the same
    high: float
    max_points: int = 6
    tried: list[tuple[float, bool]] = field(default_factory=list)  # (rate, kept the SLO share) in the order run

    @property
    def knee(self) -> float | None:
        """The highest rate that passed below every failing one (None: none passed)."""
        fail = self.lowest_fail
        ok = [r for r, passed in self.tried if passed and (fail is None or r < fail)]
        return max(ok, default=None)

    @property
    def lowest_fail(self) -> float | None:
        return min((r for r, passed in self.tried if not passed), default=None)

    def record(self, rate: float, passed: bool) -> None:
        self.tried.append((rate, passed))

    def next_rate(self) -> float | None:
        """The rate the next point runs at; None when the points are spent."""
        if len(self.tried) >= self.max_points:
            return None
        if not self.tried:
            return self.low
        knee, fail = self.knee, self.lowest_fail
        if knee is None and fail is not None:  # nothing has passed yet: halve below the lowest failure
            return fail / 2
        if fail is None:  # nothing has failed yet
            top = max(r for r, _ in self.tried)
            return self.high if top < self.high else top * 2
        assert knee is not None
        return math.sqrt(knee * fail)

    def step(self) -> float | None:
        """The bracket's ratio (failing / passing rate): how far the knee can be from the rate reported."""
        knee, fail = self.knee, self.lowest_fail
        return fail / knee if knee is not None and fail is not None else None


@dataclass
class OpenLoopPlan:
    """What an open-loop sweep runs: the given rates, or the points a knee search picks (rates per second)."""

    rates: list[float] = field(default_factory=list)
    search: KneeSearch | None = None
    slo_share: float = 0.95  # --find-max: the share of turns that must meet the SLO
    saturation_window_s: float = 60.0
    sessions: int | None = None  # --sessions: at most this many conversations a point (None: as the rate needs)
    speeds: list[float] = field(default_factory=list)  # --trace: a point per --trace-speed instead of per rate
