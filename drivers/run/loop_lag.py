"""The driver checking itself: a timer every 10 ms measures how late the event loop wakes it.

Every timestamp rampwatch records is taken on that loop, so a stamp taken while the loop ran late
(another callback held it, or the OS did not schedule the process) is late by as much: the turns with
such a stamp are marked `client busy` (drivers/model/state.py), and the lag is recorded each second.
On the driver's own loop (event_loop.DriverLoop) each late wake is also split: the driver's own work is at
most the CPU time its process spent meanwhile, and none of the time its loop lay idle past the timer; the
rest was the machine (the OS waking it late or running something else, a VM's host holding its vCPU), or a
wait on the disk (the recording is written from this loop). The CPU since the last tick takes in up to a tick
of work done before the timer was due: the driver's share is an upper bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.stats import quantile
from rampwatch.drivers.run.event_loop import overslept_after

TICK_S = 0.010
BUSY_S = ev.CLIENT_BUSY_S  # a wake-up later than this marks the stamps taken meanwhile
REPORT_S = 1.0


class LoopLagMonitor:
    """Emits one ClientLag a second: the lag's p50/p99/max and the windows in which the loop ran late."""

    def __init__(self, emit: Callable[[ev.AnyEvent], None], clock: Callable[[], float], tick_s: float = TICK_S):
        self.emit, self.clock, self.tick_s = emit, clock, tick_s
        self._lags: list[float] = []
        self._own_max = 0.0
        self._busy: list[tuple[float, float]] = []
        self._busy_own: list[bool] = []
        self.split = False  # the loop said how long it overslept (a DriverLoop): each lag is split

    async def run(self) -> None:
        overslept = overslept_after()
        started = self.clock()
        due = started + self.tick_s
        cpu = time.process_time()
        while True:
            await asyncio.sleep(max(0.0, due - self.clock()))
            now = self.clock()
            was, cpu = cpu, time.process_time()
            # The wait past this timer, on the selector's clock (perf_counter; the run's clock may be offset).
            idle = overslept(due + time.perf_counter() - now) if overslept else None
            self.tick(due, now, idle, cpu - was)
            if now - started >= REPORT_S:
                self.flush(now)
                started = now
            due = now + self.tick_s  # the next tick from now: a long block counts once, not as a backlog

    def tick(self, due: float, woke: float, overslept: float | None = None, cpu: float | None = None) -> None:
        """One wake-up, due at `due`, after the loop lay `overslept` s idle past it (None: not known, and the
        lag is not split), the process having spent `cpu` s of CPU since the last wake-up (None: not known).
        A late one leaves the window in which stamps may be late: from `due` to one tick after `woke`, since
        reads that waited behind whatever held the loop may run just after this timer in the same pass of the
        loop. The driver's own part of the lag: the rest once the oversleep is taken off, and at most `cpu`."""
        lag = max(0.0, woke - due)
        own = lag
        if overslept is not None:
            self.split = True
            own = max(0.0, min(lag - overslept, lag if cpu is None else cpu))
        self._lags.append(lag)
        self._own_max = max(self._own_max, own)
        if lag > BUSY_S:
            busy, end = self._busy, woke + self.tick_s
            if busy and due <= busy[-1][1]:  # late again straight after: one longer window, not many
                busy[-1] = (busy[-1][0], end)
                self._busy_own[-1] = self._busy_own[-1] or own > BUSY_S
            else:
                busy.append((due, end))
                self._busy_own.append(own > BUSY_S)

    def flush(self, now: float) -> None:
        lags, busy, own = sorted(self._lags), self._busy, self._busy_own
        own_max, self._own_max = self._own_max, 0.0
        self._lags, self._busy, self._busy_own = [], [], []
        if lags:
            self.emit(
                ev.ClientLag(
                    t=now,
                    p50_ms=1000 * quantile(lags, 0.5),
                    p99_ms=1000 * quantile(lags, 0.99),
                    max_ms=1000 * lags[-1],
                    busy=busy,
                    own_max_ms=1000 * own_max if self.split else None,
                    busy_own=own if self.split else [],
                )
            )
