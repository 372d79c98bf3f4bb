"""The driver checking itself: a timer every 10 ms measures how late the event loop wakes it.

Every timestamp rampwatch records is taken on that loop, so a stamp taken while the loop ran late
(another callback held it, or the OS did not schedule the process) is late by as much: the turns with
such a stamp are marked `client busy` (drivers/model/state.py), and the lag is recorded each second."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.stats import quantile

TICK_S = 0.010
BUSY_S = ev.CLIENT_BUSY_S  # a wake-up later than this marks the stamps taken meanwhile
REPORT_S = 1.0


class LoopLagMonitor:
    """Emits one ClientLag a second: the lag's p50/p99/max and the windows in which the loop ran late."""

    def __init__(self, emit: Callable[[ev.AnyEvent], None], clock: Callable[[], float], tick_s: float = TICK_S):
        self.emit, self.clock, self.tick_s = emit, clock, tick_s
        self._lags: list[float] = []
        self._busy: list[tuple[float, float]] = []

    async def run(self) -> None:
        started = self.clock()
        due = started + self.tick_s
        while True:
            await asyncio.sleep(max(0.0, due - self.clock()))
            now = self.clock()
            self.tick(due, now)
            if now - started >= REPORT_S:
                self.flush(now)
                started = now
            due = now + self.tick_s  # the next tick from now: a long block counts once, not as a backlog

    def tick(self, due: float, woke: float) -> None:
        """One wake-up, due at `due`. A late one leaves the window in which stamps may be late: from `due` to
        one tick after `woke`, since reads that waited behind whatever held the loop may run just after this
        timer in the same pass of the loop."""
        lag = max(0.0, woke - due)
        self._lags.append(lag)
        if lag > BUSY_S:
            busy, end = self._busy, woke + self.tick_s
            if busy and due <= busy[-1][1]:  # late again straight after: one longer window, not many
                busy[-1] = (busy[-1][0], end)
            else:
                busy.append((due, end))

    def flush(self, now: float) -> None:
        lags, busy = sorted(self._lags), self._busy
        self._lags, self._busy = [], []
        if lags:
            self.emit(
                ev.ClientLag(
                    t=now,
                    p50_ms=1000 * quantile(lags, 0.5),
                    p99_ms=1000 * quantile(lags, 0.99),
                    max_ms=1000 * lags[-1],
                    busy=busy,
                )
            )
