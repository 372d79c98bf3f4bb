"""The driver's own event loop, as its ClientLag events tell it: which turns' stamps are suspect.

Stamps and lag reports come in either order: a lag report covers the last second, and a batch of token
stamps is sent up to a quarter second after its first stamp. So the recent stamps (each batch with its turn)
and the recent late windows both wait here, and each new one is judged against the other's.
Both spans are the driver's wall clock: in a sped-up demo (the fold's times modelled, `k` times the recorded
ones) they are `k` times as long in the times this sees."""

from __future__ import annotations

from collections import deque

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.turns import TurnRecord

SHOWN_S = 2.5  # wall s: a lag report older than this (the driver reports each second) is not "now"
KEPT_S = 3.0  # wall s: longer than a lag report's second plus a stamp batch's delay: every pair is judged


class ClientCheck:
    """The latest lag report, the worst lag of the run, and the turns marked client busy."""

    def __init__(self) -> None:
        self.k = 1.0  # the fold's seconds per wall second (a sped-up demo's time scale; RunState sets it)
        self.latest: ev.ClientLag | None = None
        self.worst_ms: float | None = None  # None: the recording has no lag reports (made before them)
        self.marked = 0  # turns marked client busy so far (a finished turn may be marked after its end)
        self._stamps: deque[tuple[TurnRecord, list[float]]] = deque()
        self._windows: deque[tuple[float, float]] = deque()

    def stamped(self, rec: TurnRecord, times: list[float]) -> None:
        stamps = self._stamps
        stamps.append((rec, times))
        while stamps[0][1][-1] < times[-1] - KEPT_S * self.k:
            stamps.popleft()
        for window in self._windows:
            self.marked += _judge(rec, times, window)

    def apply(self, e: ev.ClientLag) -> None:
        """Marks the turns with a stamp taken while the driver's loop ran late (their times may be late too)."""
        self.latest = e
        self.worst_ms = max(e.max_ms, self.worst_ms or 0.0)
        windows = self._windows
        windows.extend(e.busy)
        while windows and windows[0][1] < e.t - KEPT_S * self.k:
            windows.popleft()
        for window in e.busy:
            for rec, times in self._stamps:
                self.marked += _judge(rec, times, window)

    def lag_ms(self, now: float) -> float | None:
        """The worst lag of the latest second, while that is recent and over the busy bar."""
        lag = self.latest
        if lag is None or now - lag.t > SHOWN_S * self.k or lag.max_ms <= 1000 * ev.CLIENT_BUSY_S:
            return None
        return lag.max_ms


def _judge(rec: TurnRecord, times: list[float], window: tuple[float, float]) -> bool:
    """Marks `rec` client busy if a stamp of `times` lies in `window`; True if that marked it now."""
    a, b = window
    if not rec.client_busy and times[0] <= b and times[-1] >= a and any(a <= t <= b for t in times):
        rec.client_busy = True
        return True
    return False
