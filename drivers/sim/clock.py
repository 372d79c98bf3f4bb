"""The simulated engine's time source. In the product it is the machine's
monotonic clock and a step really takes its modelled time; in tests a virtual
clock jumps to each step's end, so what the engine does, and when on its own
timeline, no longer depends on how busy the machine is."""

from __future__ import annotations

import asyncio
import time


class WallClock:
    """Real time: `sleep_until` waits for the deadline on the event loop."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


class VirtualClock:
    """Simulated time that moves only when the engine sleeps: `sleep_until`
    sets the time to the deadline at once and yields to the loop, so the
    requests' waiters see each step's tokens before the next step. The engine
    must be its only sleeper: nothing else may wait on this clock."""

    def __init__(self, start: float = 0.0):
        self.t = start

    def now(self) -> float:
        return self.t

    async def sleep_until(self, deadline: float) -> None:
        self.t = max(self.t, deadline)
        await asyncio.sleep(0)


SimClock = WallClock | VirtualClock
