"""The driver checking itself: how late its event loop came to look, and whose the delay was.

Every timestamp rampwatch records is taken on that loop, so a stamp taken while the loop ran late is late by
as much: the turns with such a stamp are marked `client busy` (drivers/model/client_check.py), and the lag is
recorded each second. A timer every 10 ms measures the lag (its p50/p99/max), and keeps the loop waking often
enough to see the OS wake it late.
On the driver's own loop (event_loop.DriverLoop) reads are stamped when the loop woke for them, and the loop
notes each late wake itself (event_loop.LateWake): a window covers exactly the stamps taken at that wake, and
says whether the driver's own work (the CPU its process spent in the pass that held the loop) made it late,
or the machine (the OS or a VM's host waking it late, or taking the core mid-pass; a disk wait, since the
recording is written from this loop, reads the same). On any other loop a late timer leaves a window from
when it was due to a tick after it woke, all the driver's own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.model.stats import quantile
from rampwatch.drivers.run.event_loop import DriverLoop

TICK_S = 0.010
BUSY_S = ev.CLIENT_BUSY_S  # a wake-up later than this marks the stamps taken meanwhile
REPORT_S = 1.0
EDGE_S = 1e-6  # a late wake's window: after the stamps of the pass that held the loop, through its own


class LoopLagMonitor:
    """Emits one ClientLag a second: the lag's p50/p99/max and the windows in which the loop ran late."""

    def __init__(self, emit: Callable[[ev.AnyEvent], None], clock: Callable[[], float], tick_s: float = TICK_S):
        self.emit, self.clock, self.tick_s = emit, clock, tick_s
        self._lags: list[float] = []
        self._max = 0.0
        self._own_max = 0.0
        self._busy: list[tuple[float, float]] = []
        self._busy_own: list[bool] = []
        self.split = False  # the loop notes its late wakes (a DriverLoop): each window says whose it was
        self._loop: DriverLoop | None = None
        self._offset = 0.0  # the run's clock less the loop's (time.perf_counter)
        self._since = 0.0  # when this started watching, on the run's clock

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop if isinstance(loop, DriverLoop) else None
        self.split = self._loop is not None  # a second with no late wake is the driver's, 0 ms, too
        clock = self.clock
        self._offset = -clock.origin if isinstance(clock, RunClock) else clock() - time.perf_counter()
        started = self._since = clock()
        due = started + self.tick_s
        while True:
            await asyncio.sleep(max(0.0, due - clock()))
            now = clock()
            if self._loop is None:
                self.tick(due, now)
            else:
                self.lag(due, self._loop.passes.woke + self._offset)  # the timer was seen when this pass woke
                self._take_late()
            if now - started >= REPORT_S:
                self.flush(now)
                started = now
            due = now + self.tick_s  # the next tick from now: a long block counts once, not as a backlog

    def _take_late(self) -> None:
        """The late wakes the DriverLoop noted since the last call, on the run's clock."""
        assert self._loop is not None
        for late in self._loop.take_late():
            start = late.start + self._offset
            if start >= self._since:  # not the setup that ran before this started watching
                self.late(start, late.end + self._offset, late.own_s)

    def lag(self, due: float, woke: float) -> None:
        """One timer, due at `due`, seen at `woke`: the lag's statistics."""
        lag = max(0.0, woke - due)
        self._lags.append(lag)
        self._max = max(self._max, lag)

    def tick(self, due: float, woke: float) -> None:
        """A timer on a loop that does not note its late wakes: a late one leaves the window in which stamps
        may be late, from `due` to one tick after `woke` (reads that waited behind whatever held the loop may
        run just after this timer in the same pass, stamped then), counted as the driver's own."""
        self.lag(due, woke)
        if woke - due > BUSY_S:
            self._window(due, woke + self.tick_s, True)

    def late(self, start: float, end: float, own_s: float) -> None:
        """A late wake the DriverLoop noted: the stamps taken at `end` may be `end - start` s late, `own_s` of it
        the driver's own work. Its window holds exactly those stamps."""
        self.split = True
        self._max = max(self._max, end - start)
        self._own_max = max(self._own_max, own_s)
        if end - start > BUSY_S:
            self._window(start + EDGE_S, end + EDGE_S, own_s > BUSY_S)

    def _window(self, start: float, end: float, own: bool) -> None:
        busy = self._busy
        if busy and start <= busy[-1][1]:  # late again straight after: one longer window, not many
            busy[-1] = (busy[-1][0], max(end, busy[-1][1]))
            self._busy_own[-1] = self._busy_own[-1] or own
        else:
            busy.append((start, end))
            self._busy_own.append(own)

    def flush(self, now: float) -> None:
        if self._loop is not None:
            self._take_late()
        lags, busy, own = sorted(self._lags), self._busy, self._busy_own
        worst, own_max = self._max, self._own_max
        self._lags, self._busy, self._busy_own, self._max, self._own_max = [], [], [], 0.0, 0.0
        if lags:
            self.emit(
                ev.ClientLag(
                    t=now,
                    p50_ms=1000 * quantile(lags, 0.5),
                    p99_ms=1000 * quantile(lags, 0.99),
                    max_ms=1000 * worst,
                    busy=busy,
                    own_max_ms=1000 * own_max if self.split else None,
                    busy_own=own if self.split else [],
                )
            )
