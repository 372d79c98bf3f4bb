"""The driver's event loop: asyncio's own, with a selector that times each pass of the loop.

Every read is stamped when the loop woke for it (`PassSelector.woke`, drivers/client/wire.py), not when its
callback got its turn: the 64th stream read in a pass is stamped as early as the first. A stamp is then late
only if the loop came to look late, which happens two ways, and the selector notes both:
  - the pass before held the loop (the driver's work, or the OS taking the core from it mid-pass), and what
    became readable meanwhile waited for the next wake. The CPU the process spent in that pass says how
    much of it was the driver's own;
  - the loop waited past its timer (the OS or a virtual machine's host woke it late): the machine's.
The loop-lag check (loop_lag.py) turns these into the windows that mark turns `client busy`."""

from __future__ import annotations

import asyncio
import selectors
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

NOTED_S = 0.001  # a late wake by more than this is noted (the run's worst is reported, as is the driver's own)
KEPT = 4096  # late wakes kept until read (the lag check reads them every 10 ms; `watch` never does)


class LateWake(NamedTuple):
    """The stamps taken at the wake `end` (time.perf_counter) may be `end - start` s late, `own_s` of it the
    driver's own work (the CPU its process spent meanwhile)."""

    start: float
    end: float
    own_s: float


class PassSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The default selector, noting when each wait returned (`woke`) and each wake that came late."""

    def __init__(self) -> None:
        super().__init__()
        self.woke = time.perf_counter()  # when the latest wait returned: this pass's reads are stamped then
        self._cpu = time.process_time()
        self.late: deque[LateWake] = deque(maxlen=KEPT)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        entered = time.perf_counter()
        held_since = self.woke if entered - self.woke > NOTED_S else None
        if held_since is not None:  # a long pass: how much of it the process ran (not the OS running another)
            own = min(entered - held_since, time.process_time() - self._cpu)
        ready = super().select(timeout)
        woke = self.woke = time.perf_counter()
        self._cpu = time.process_time()
        # What the wait found ready at once waited through the pass. A wait that slept found nothing: what it
        # woke for came after the pass, which delayed no read.
        if held_since is not None and woke - entered <= NOTED_S:
            self.late.append(LateWake(held_since, woke, own))
        if timeout and timeout > 0 and woke - entered - timeout > NOTED_S:
            self.late.append(LateWake(entered + timeout, woke, 0.0))  # idle past its timer: the machine's
        return ready


class DriverLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, which says when it woke for the current pass and which wakes came late."""

    def __init__(self) -> None:
        self.passes = PassSelector()
        super().__init__(self.passes)

    def take_late(self) -> list[LateWake]:
        """The late wakes noted since the last call (time.perf_counter)."""
        late = list(self.passes.late)
        self.passes.late.clear()
        return late


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a DriverLoop (Python 3.11+; plain asyncio.run before that)."""
    if not hasattr(asyncio, "Runner"):
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=DriverLoop) as runner:
        return runner.run(main)
