"""The driver's own event loop, as its ClientLag events tell it: which turns' stamps are suspect.

A stamp is judged when the lag report for its second arrives (up to a second after the turn may have
finished), so the recent stamps wait here, each batch with its turn, until then."""

from __future__ import annotations

from collections import deque

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.turns import TurnRecord

SHOWN_S = 2.5  # a lag report older than this (the driver reports each second) is not "now"
STAMPS_KEPT_S = 3.0  # longer than a lag report's second: every stamp is judged by one


class ClientCheck:
    """The latest lag report, the worst lag of the run, and the turns marked client busy."""

    def __init__(self) -> None:
        self.latest: ev.ClientLag | None = None
        self.worst_ms: float | None = None  # None: the recording has no lag reports (made before them)
        self._stamps: deque[tuple[TurnRecord, list[float]]] = deque()

    def stamped(self, rec: TurnRecord, times: list[float]) -> None:
        stamps = self._stamps
        stamps.append((rec, times))
        while stamps[0][1][-1] < times[-1] - STAMPS_KEPT_S:
            stamps.popleft()

    def apply(self, e: ev.ClientLag) -> None:
        """Marks the turns with a stamp taken while the driver's loop ran late (their times may be late too)."""
        self.latest = e
        self.worst_ms = max(e.max_ms, self.worst_ms or 0.0)
        for a, b in e.busy:
            for rec, times in self._stamps:
                if not rec.client_busy and times[0] <= b and times[-1] >= a and any(a <= t <= b for t in times):
                    rec.client_busy = True

    def lag_ms(self, now: float) -> float | None:
        """The worst lag of the latest second, while that is recent and over the busy bar."""
        lag = self.latest
        if lag is None or now - lag.t > SHOWN_S or lag.max_ms <= 1000 * ev.CLIENT_BUSY_S:
            return None
        return lag.max_ms
