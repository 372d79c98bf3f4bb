"""--workers: each worker's clock set to the run's and its offset measured, by ping-pong over the worker's link.
At the start the exchange with the shortest round trip of PINGS sets the worker's origin (the run's t = 0 on its
clock); then every CLOCK_EVERY_S the best of three exchanges is recorded (WorkerClock) with half its round trip as
the uncertainty."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run import worker_wire as ww

PINGS = 8  # clock exchanges at the start: the one with the shortest round trip sets the worker's clock
CLOCK_EVERY_S = 5.0  # then one exchange this often, recorded (WorkerClock)


class WorkerUnreachable(Exception):
    """A clock exchange got no answer: the worker died, or its loop is held for seconds."""


class Link(Protocol):
    def send(self, message: object) -> None: ...


class Clocked(Protocol):
    """What an exchange needs of a worker (workers._Worker): its Pong answers each future of `pongs`."""

    index: int
    link: Link
    done: asyncio.Future[None]
    pongs: dict[int, asyncio.Future[float]]
    origin: float | None


class WorkerClocks:
    def __init__(self, emit: Callable[..., None], clock: Callable[[], float]):
        self.emit, self.clock = emit, clock
        self._ping = 0

    async def exchange(self, w: Clocked) -> tuple[float, float, float]:
        """One ping-pong: (sent, the worker's reading, received), on time.perf_counter of each side."""
        self._ping += 1
        n = self._ping
        pong = w.pongs[n] = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        w.link.send(ww.Ping(n=n))
        try:
            await asyncio.wait([pong, w.done], timeout=10.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            w.pongs.pop(n, None)
        if not pong.done():
            why = "it is gone" if w.done.done() else "no answer in 10 s"
            raise WorkerUnreachable(f"worker {w.index}: no clock exchange ({why})")
        return sent, pong.result(), time.perf_counter()

    async def set(self, w: Clocked) -> float:
        """The run's t = 0 on the worker's clock, from the exchange with the shortest round trip."""
        best = min([await self.exchange(w) for _ in range(PINGS)], key=lambda x: x[2] - x[0])
        sent, theirs, received = best
        origin = getattr(self.clock, "origin", 0.0)
        return origin + theirs - (sent + received) / 2

    async def measure(self, w: Clocked) -> None:
        """Record how far the worker's run clock is from ours now, give or take half the round trip."""
        if w.done.done() or w.origin is None:  # (a replacement still starting: its clock is not set yet)
            return
        try:  # the best of three: a round trip that met a busy loop says little
            exchanges = [await self.exchange(w) for _ in range(3)]
        except WorkerUnreachable:
            return  # gone (its exit says so), or too busy to answer in 10 s (its lag reports say so)
        sent, theirs, received = min(exchanges, key=lambda x: x[2] - x[0])
        origin = getattr(self.clock, "origin", 0.0)
        offset = (theirs - w.origin) - ((sent + received) / 2 - origin)
        self.emit(ev.WorkerClock(t=self.clock(), worker=w.index, offset_s=offset, uncertainty_s=(received - sent) / 2))

    async def keep(self, workers: Sequence[Clocked]) -> None:
        """Every CLOCK_EVERY_S, measure each worker (the list as it grows: replacements join it)."""
        while True:
            await asyncio.sleep(CLOCK_EVERY_S)
            for w in workers:
                await self.measure(w)
