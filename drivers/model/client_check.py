"""The driver's own event loop, as its ClientLag events tell it: which turns' stamps are suspect.

Stamps and lag reports come in either order: a lag report covers the last second, and a batch of token
stamps is sent up to a quarter second after its first stamp. So the recent stamps (each batch with its turn)
and the recent late windows both wait here, and each new one is judged against the other's.
Both spans are the driver's wall clock: in a sped-up demo (the fold's times modelled, `k` times the recorded
ones) they are `k` times as long in the times this sees.
A window carries whose it was: the driver's own (its work held the loop) or the machine's (the loop lay idle
past its timer, or was held without spending the CPU: the OS, a VM's host); a turn is marked `client busy` by
either, and `client_busy_own` says whether a window of the driver's own marked it."""

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
        self.worst_own_ms: float | None = None  # the worst with the machine's late wakes taken off; None: not split
        self.marked = 0  # turns marked client busy so far (a finished turn may be marked after its end)
        self.marked_own = 0  # ... of them by a window of the driver's own
        self._stamps: deque[tuple[TurnRecord, list[float]]] = deque()
        self._windows: deque[tuple[float, float, bool]] = deque()

    def stamped(self, rec: TurnRecord, times: list[float]) -> None:
        stamps = self._stamps
        stamps.append((rec, times))
        while stamps[0][1][-1] < times[-1] - KEPT_S * self.k:
            stamps.popleft()
        for window in self._windows:
            self._judge(rec, times, window)

    def apply(self, e: ev.ClientLag) -> None:
        """Marks the turns with a stamp taken while the driver's loop ran late (their times may be late too)."""
        self.latest = e
        self.worst_ms = max(e.max_ms, self.worst_ms or 0.0)
        if e.own_max_ms is not None:
            self.worst_own_ms = max(e.own_max_ms, self.worst_own_ms or 0.0)
        # A report that does not split its windows (made before, or on another loop): each is the driver's.
        owns = e.busy_own if len(e.busy_own) == len(e.busy) else [True] * len(e.busy)
        fresh = [(a, b, own) for (a, b), own in zip(e.busy, owns)]
        windows = self._windows
        windows.extend(fresh)
        while windows and windows[0][1] < e.t - KEPT_S * self.k:
            windows.popleft()
        for window in fresh:
            for rec, times in self._stamps:
                self._judge(rec, times, window)

    def lag_ms(self, now: float) -> float | None:
        """The worst lag of the latest second, while that is recent and over the busy bar."""
        lag = self.latest
        if lag is None or now - lag.t > SHOWN_S * self.k or lag.max_ms <= 1000 * ev.CLIENT_BUSY_S:
            return None
        return lag.max_ms

    def lag_is_machines(self) -> bool:
        """The latest second's late windows were all the machine waking the driver late, none its own work."""
        lag = self.latest
        return lag is not None and bool(lag.busy_own) and not any(lag.busy_own)

    def _judge(self, rec: TurnRecord, times: list[float], window: tuple[float, float, bool]) -> None:
        """Marks `rec` client busy if a stamp of `times` lies in `window` (and as the driver's own, if it was)."""
        a, b, own = window
        if (rec.client_busy and (rec.client_busy_own or not own)) or times[0] > b or times[-1] < a:
            return
        if any(a <= t <= b for t in times):
            self.marked += not rec.client_busy
            self.marked_own += own and not rec.client_busy_own
            rec.client_busy = True
            rec.client_busy_own = rec.client_busy_own or own
