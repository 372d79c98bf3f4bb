"""The driver checking itself: how late its event loop came to look, and whose the delay was.

A stamp the loop takes while it runs late is late by as much: the turns with such a stamp are marked
`client busy` (drivers/model/client_check.py), and the lag is recorded each second. A timer every 10 ms
measures the lag (its p50/p99/max), and keeps the loop waking often enough to see the OS wake it late.
On the driver's own loop (event_loop.DriverLoop) the loop notes each late wake itself (event_loop.LateWake): a
window covers exactly the stamps that wake may have put off, and says whether the driver's own work (the CPU
its process spent in the pass that held the loop) made it late, or the machine (the OS or a VM's host waking
it late, or taking the core mid-pass; a disk wait, since the recording is written from this loop, reads the
same). A read there carries the kernel's receive time of its last bytes (plain HTTP or TLS,
drivers/net/stamped_socket.py), which no late wake puts off, or where the kernel gives none the time the loop
woke for it: a late wake at which no read was stamped at the wake leaves no window (a read that carried several
tokens, held long, marks its own turn: event_loop.PassSelector.piled_up). On any other
loop (or clock, whose reads are not stamped at the loop's wakes) a late timer leaves a window from when it was
due to a tick after it woke, all the driver's own.
Each report also says how much CPU the process spent over its second (time.process_time, every thread of the
process), and, in a driver worker (--workers N), whose loop it was: that worker's windows mark only its turns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.model.stats import quantile
from rampwatch.drivers.run.event_loop import DriverLoop, LateWake, PassSelector

TICK_S = 0.010
BUSY_S = ev.CLIENT_BUSY_S  # a wake-up later than this marks the stamps taken meanwhile
REPORT_S = 1.0


class LoopLagMonitor:
    """Emits one ClientLag a second: the lag's p50/p99/max and the windows in which the loop ran late."""

    def __init__(
        self,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        tick_s: float = TICK_S,
        worker: int | None = None,
        cpu: Callable[[], float] = time.process_time,
    ):
        self.emit, self.clock, self.tick_s = emit, clock, tick_s
        self.worker = worker  # the driver worker whose loop this watches (None: the run's one driver)
        self.cpu = cpu  # the process's CPU seconds so far
        self._cpu_since = cpu()  # at the last report (or when this was made)
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
        loop, clock = asyncio.get_running_loop(), self.clock
        # The wakes the loop notes are those its wake-stamped reads take, on the run's clock (wire.read_stamp).
        self._loop = loop if isinstance(loop, DriverLoop) and isinstance(clock, RunClock) else None
        self.split = self._loop is not None  # a second with no late wake is the driver's, 0 ms, too
        self._offset = -clock.origin if isinstance(clock, RunClock) else 0.0
        started = self._since = clock()
        self._cpu_since = self.cpu()  # the CPU of its second from here, not the setup before
        due = started + self.tick_s
        while True:
            if self._loop is None:
                await asyncio.sleep(max(0.0, due - clock()))
                now = clock()
                self.tick(due, now)
            else:
                seen = loop.create_future()
                loop.call_later(max(0.0, due - clock()), _seen, seen, self._loop.passes)
                woke = await seen  # the wake of the pass the timer fired in
                now = clock()
                self.lag(due, woke + self._offset)
                self._take_late()
            if now - started >= REPORT_S:
                self.flush(now)
                started = now
            due = now + self.tick_s  # the next tick from now: a long block counts once, not as a backlog

    def _take_late(self) -> None:
        """The late wakes the DriverLoop noted since the last call, on the run's clock."""
        assert self._loop is not None
        for wake in self._loop.take_late():
            if wake.end + self._offset > self._since:  # not the setup before this started watching
                self.late(wake)

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

    def late(self, wake: LateWake) -> None:
        """A late wake the DriverLoop noted: its window holds exactly the stamps it may have put off."""
        lag = wake.end - wake.start
        self.split = True  # only a DriverLoop notes them
        self._max = max(self._max, lag)
        self._own_max = max(self._own_max, wake.own_s)
        if lag > BUSY_S and wake.stamped:  # no read stamped at it (the kernel's times): nothing to mark
            self._window(*wake.window(self._offset), wake.own_s > BUSY_S)

    def _window(self, start: float, end: float, own: bool) -> None:
        busy, owns = self._busy, self._busy_own
        # Late again straight after, and by the same hand: one longer window, not many.
        if busy and start <= busy[-1][1] and owns[-1] == own:
            busy[-1] = (busy[-1][0], max(end, busy[-1][1]))
        else:
            busy.append((start, end))
            owns.append(own)

    def flush(self, now: float) -> None:
        if self._loop is not None:
            self._take_late()
        lags, busy, own = sorted(self._lags), self._busy, self._busy_own
        worst, own_max = self._max, self._own_max
        self._lags, self._busy, self._busy_own, self._max, self._own_max = [], [], [], 0.0, 0.0
        if lags or busy:  # a window noted since the last tick (the run's last) is kept too
            cpu = self.cpu()
            cpu_s, self._cpu_since = cpu - self._cpu_since, cpu  # since the last report: no second left out
            self.emit(
                ev.ClientLag(
                    t=now,
                    p50_ms=1000 * quantile(lags, 0.5) if lags else 0.0,
                    p99_ms=1000 * quantile(lags, 0.99) if lags else 0.0,
                    max_ms=1000 * worst,
                    busy=busy,
                    own_max_ms=1000 * own_max if self.split else None,
                    busy_own=own if self.split else [],
                    worker=self.worker,
                    cpu_s=cpu_s,
                )
            )


def _seen(seen: asyncio.Future[float], passes: PassSelector) -> None:
    """The timer's callback: the wake of the pass it fired in (time.perf_counter)."""
    if not seen.done():
        seen.set_result(passes.woke)
