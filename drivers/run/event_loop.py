"""The driver's event loop: asyncio's own, with a selector that times each pass of the loop.

A read with no kernel time (a system without SO_TIMESTAMPNS) is stamped when the loop woke for it
(`PassSelector.read_time`, drivers/net/wire.py), not when its callback got its turn: the 64th stream read in a
pass is stamped as early as the first. A stamp is then off only if the loop came to look late, or handled a
read long after it woke, and the selector notes each:
  - the pass before held the loop (the driver's work, or the OS taking the core from it mid-pass), and what
    became readable meanwhile waited for the next wake. The CPU the process spent in that pass (all its
    threads: each is the driver's) says how much of it was the driver's own;
  - a read was handled more than 5 ms after its pass woke: bytes that came since are stamped early by as
    much, so that pass's own wake counts as late too;
  - the loop waited past its timer (the OS or a virtual machine's host woke it late): the machine's.
A read over plain HTTP or TLS carries the kernel's receive time of its last bytes (drivers/net/stamped_socket.py),
which a late wake does not put off. The loop-lag check (loop_lag.py) turns the late wakes at which a read was
stamped with the wake into the windows that mark turns `client busy`; the others count for the lag alone. A
kernel-stamped read that carried several tokens is exact for the last alone: the selector says whether the
earlier ones may have come over 5 ms before it (`piled_up`), and that read's turn alone is marked."""

from __future__ import annotations

import asyncio
import math
import selectors
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, NamedTuple, TypeVar

from rampwatch.drivers.model.events import CLIENT_BUSY_S
from rampwatch.drivers.net.pass_share import PassShare

T = TypeVar("T")

NOTED_S = 0.001  # a late wake by more than this is noted (the run's worst is reported, as is the driver's own)
KEPT = 4096  # late wakes kept until read (the lag check reads them every 10 ms; `watch` never does)
EDGE_S = 1e-6  # how far a window reaches past a wake it holds (or short of one it leaves out)


class LateWake(NamedTuple):
    """The stamps taken at the wake `end` (time.perf_counter), and at `start` where `from_start`, may be
    `end - start` s off, `own_s` of it the driver's own work (the CPU its process spent meanwhile); `stamped`:
    a read was stamped at one of those wakes (False: every read there carried the kernel's time)."""

    start: float
    end: float
    own_s: float
    from_start: bool = False
    stamped: bool = True

    def window(self, offset: float) -> tuple[float, float]:
        """The span holding exactly those stamps, on a clock `offset` s from time.perf_counter."""
        edge = -EDGE_S if self.from_start else EDGE_S
        return self.start + offset + edge, self.end + offset + EDGE_S


class PassSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The default selector, noting when each wait returned (`woke`) and each wake that came late."""

    def __init__(self) -> None:
        super().__init__()
        self.woke = time.perf_counter()  # when the latest wait returned: this pass's reads are stamped then
        self._cpu = time.process_time()
        self._read_late = False  # this pass handled a read long after it woke
        self._stamped = False  # this pass stamped a read with its wake
        self._pending: LateWake | None = None  # this pass's wake came late: noted once its reads are known
        self._carried: LateWake | None = None  # ... one that stamped none, carried to the wake after
        self._was_carried = False  # this pass's late wake is one carried
        self._late_empty = False  # this pass's late wake returned no socket
        self._entered = 0.0  # when the latest wait began
        self._kernel: tuple[float, float] | None = None  # the read being handled: its kernel_read figures
        self.late: deque[LateWake] = deque(maxlen=KEPT)

    def read_time(self) -> float:
        """The time a read handled now is stamped with: when this pass woke (time.perf_counter)."""
        woke = self.woke
        self._stamped, self._kernel = True, None
        if time.perf_counter() - woke > CLIENT_BUSY_S:
            self._read_late = True
        return woke

    def kernel_read(self, arrived: float, since: float) -> None:
        """The read being handled is stamped with the kernel's receive time of its last bytes, `arrived`; its
        first bytes came after `since` (the socket's last read's stamp, or when that read emptied it), both on
        time.perf_counter."""
        self._kernel = (arrived, since)

    def read_over(self) -> None:
        """The read told of by kernel_read has been handled."""
        self._kernel = None

    def piled_up(self) -> bool | None:
        """The read being handled carried several tokens under its one stamp. None: the earlier ones came no more
        than 5 ms before the last (or it was stamped at the wake, which a late wake's window holds); else they may
        have, and whether the driver's own work held them: the CPU of the late pass before this wake and of this
        pass until the last bytes came."""
        if self._kernel is None:
            return None
        arrived, since = self._kernel
        late = self._pending
        # When the loop last looked for reads: the late pass's start, or the wait's if the machine woke it late.
        looked = min(late.start, self._entered) if late is not None else self.woke - NOTED_S
        if arrived - max(looked, since) <= CLIENT_BUSY_S:
            return None
        into_pass = min(max(0.0, arrived - self.woke), time.process_time() - self._cpu)
        return (late.own_s if late is not None else 0.0) + into_pass > CLIENT_BUSY_S

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        entered = self._entered = time.perf_counter()
        self._carried = self._settle(entered)
        since, read_late = self.woke, self._read_late
        held = entered - since > NOTED_S
        if held:  # a long pass: how much of it the process ran (not the OS running another)
            own = min(entered - since, time.process_time() - self._cpu)
            if timeout != 0:  # what waited through the pass is there at once; a wait that sleeps is for later
                ready = super().select(0)
                if ready or read_late:
                    woke = time.perf_counter()
                    return self._woke(ready, woke, LateWake(since, woke, own, read_late))
                held = False  # nothing waited through it
        ready = super().select(timeout)
        woke = time.perf_counter()
        if held:
            return self._woke(ready, woke, LateWake(since, woke, own, read_late))
        # The selector waits whole milliseconds, rounded up (epoll): past that is late.
        asked = math.ceil(timeout * 1e3) * 1e-3 if timeout else 0.0
        if timeout is not None and woke - entered - asked > NOTED_S:  # idle past its timer: the machine's
            return self._woke(ready, woke, LateWake(entered + asked, woke, 0.0))
        return self._woke(ready, woke)

    def _settle(self, entered: float) -> LateWake | None:
        """The pass that began late is over, and whether it stamped a read is known: note its wake. One that
        stamped none in a pass that ended at once is carried to the next wake (returned): a wait that timed out
        while the OS held the process returns no socket, and what waited through it is read a pass later."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        if pending.from_start or self._stamped:
            self.late.append(pending)
        elif entered - pending.end < NOTED_S and self._late_empty and not self._was_carried:  # once, no creeping
            return pending
        else:
            self.late.append(pending._replace(stamped=False))
        return None

    def _woke(
        self, ready: list[tuple[selectors.SelectorKey, int]], woke: float, late: LateWake | None = None
    ) -> list[tuple[selectors.SelectorKey, int]]:
        """A wait returned at `woke`, which starts the next pass (a late wake carried from the last reaches it)."""
        carried, self._carried = self._carried, None
        self._was_carried = False
        if carried is not None:
            if woke - self._entered < NOTED_S:  # the wait after it returned at once: what it put off is read now
                own = max(carried.own_s, late.own_s) if late is not None else carried.own_s
                late, self._was_carried = LateWake(carried.start, woke, own, carried.from_start), True
            else:  # an idle wait between: it is not this wake's
                self.late.append(carried._replace(stamped=False))
        self.woke, self._late_empty, self._kernel = woke, not ready, None
        self._cpu, self._read_late, self._stamped = time.process_time(), False, False
        self._pending = late
        return ready


class DriverLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, which says when it woke for the current pass and which wakes came late, and
    spreads many sessions' turn steps over its passes (`share`, drivers/net/pass_share.py)."""

    def __init__(self) -> None:
        self.passes = PassSelector()
        self.share = PassShare(lambda: self.passes.woke)
        super().__init__(self.passes)

    def take_late(self) -> list[LateWake]:
        """The late wakes noted since the last call (time.perf_counter)."""
        late = list(self.passes.late)
        self.passes.late.clear()
        return late


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a DriverLoop."""
    with asyncio.Runner(loop_factory=DriverLoop) as runner:
        return runner.run(main)
