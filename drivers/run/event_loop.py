"""The driver's event loop: asyncio's own, with a selector that notes how long each wait overslept.

When the loop waits for I/O it asks the kernel to wake it by its next timer. If it wakes later than that,
the loop was idle and the OS (or a virtual machine's host, waking an idle vCPU) was late: not the driver's
own work. The loop-lag check (loop_lag.py) subtracts that from each late wake, so a `client busy` mark says
whether the driver itself or the machine held its stamps back."""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _OversleepSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The default selector, keeping the latest wait that returned past its timeout: (deadline, woke)."""

    def __init__(self) -> None:
        super().__init__()
        self.late_wait = (0.0, 0.0)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if not timeout or timeout <= 0:
            return super().select(timeout)
        deadline = time.perf_counter() + timeout
        ready = super().select(timeout)
        woke = time.perf_counter()
        if woke > deadline:
            self.late_wait = (deadline, woke)
        return ready


class DriverLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, which can say how long it lay waiting past a timer it had asked to wake at."""

    def __init__(self) -> None:
        self._waits = _OversleepSelector()
        super().__init__(self._waits)

    def overslept_after(self, t: float) -> float:
        """Seconds after `t` (time.perf_counter) the loop spent idle past the timer it was waiting for. Once a
        timer is due the loop does not wait again before running it, so only the latest late wait can hold
        back a timer due at `t`."""
        deadline, woke = self._waits.late_wait
        return max(0.0, woke - max(deadline, t))


def overslept_after() -> Callable[[float], float] | None:
    """The running loop's `overslept_after` (a DriverLoop's), or None on any other loop (no wake is then the
    machine's)."""
    loop = asyncio.get_running_loop()
    return loop.overslept_after if isinstance(loop, DriverLoop) else None


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a DriverLoop (Python 3.11+; plain asyncio.run before that)."""
    if not hasattr(asyncio, "Runner"):
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=DriverLoop) as runner:
        return runner.run(main)
