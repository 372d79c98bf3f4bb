"""Open-loop arrivals (--arrivals RATE): conversations start at Poisson-distributed times, seeded, whether
or not the server is busy; --max-live caps how many run at once (a later arrival waits, its wait counted)."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rampwatch.drivers.client.session import SessionRunner
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.pacing import TurnGate

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(?:/\s*(s|sec|m|min|h|hour))?\s*$", re.IGNORECASE)
_PER_S = {"s": 1.0, "sec": 1.0, "m": 1 / 60, "min": 1 / 60, "h": 1 / 3600, "hour": 1 / 3600}


def parse_rate(text: str) -> float:
    """'2/min', '0.5/s', '30/h' or a plain number (per minute) -> conversations per second; BadInput otherwise."""
    m = _RATE.match(text or "")
    if not m:
        raise BadInput(f"--arrivals {text!r}: not a rate (use e.g. 2/min, 0.5/s, 30/h; a plain number is per minute)")
    value = float(m.group(1))
    if value <= 0:
        raise BadInput(f"--arrivals {text!r}: the rate must be above zero")
    return value * _PER_S[(m.group(2) or "min").lower()]


def parse_rates(text: str) -> list[float]:
    """'0.5,1,2,4/min' -> conversations per second, ascending; a unit written on the last rate applies to the
    rates written without one (a sweep's --arrivals)."""
    items = [p.strip() for p in (text or "").split(",")]
    unit = _RATE.match(items[-1])
    suffix = f"/{unit.group(2)}" if unit and unit.group(2) else ""
    rates = [parse_rate(item if "/" in item or not suffix else item + suffix) for item in items]
    if len(set(rates)) != len(rates):
        raise BadInput(f"--arrivals {text!r}: a rate is given twice")
    return sorted(rates)


def parse_rate_range(text: str) -> tuple[float, float]:
    """'0.5..8/min' -> (low, high) in conversations per second (--find-max's range); the unit as parse_rates."""
    lo, dots, hi = (text or "").partition("..")
    if not dots:
        raise BadInput(f"--arrivals {text!r}: --find-max searches a range: give LOW..HIGH, e.g. 0.5..8/min")
    try:
        low, high = parse_rates(f"{lo},{hi}")
    except BadInput as e:
        raise BadInput(f"--arrivals {text!r}: {str(e).partition(': ')[2] or 'the two ends must differ'}") from None
    return low, high


def arrival_times(rate_per_s: float, count: int, seed: int) -> list[float]:
    """The first `count` arrival times (seconds from the run's start) of a Poisson process of `rate_per_s`:
    exponential gaps drawn from Random(seed), the first arrival one gap after the start."""
    draw = random.Random(seed)
    times, t = [], 0.0
    for _ in range(count):
        t += draw.expovariate(rate_per_s)
        times.append(t)
    return times


PREPARE_AHEAD_S = 1.0  # a conversation builds and counts its first prompt this long before it arrives


@dataclass
class ArrivingSession:
    """A conversation of the open loop, made ahead of its arrival time."""

    runner: SessionRunner
    gate: TurnGate
    emit: Callable[[ev.AnyEvent], None]

    async def prepare(self) -> None:
        """Before the arrival: what the client would otherwise do after it (its first prompt, counted)."""
        await self.runner.prepare()

    def arrive(self) -> Callable[[], Awaitable[bool]]:
        """At the arrival: the conversation joins the run and is announced; returns what runs it."""
        self.gate.join()
        self.emit(self.runner.plan_event())
        return self.runner.run

    def abandon(self) -> None:
        """Cancelled before it arrived: its connection closes (run() closes its own otherwise)."""
        self.runner.close()


async def run_arrivals(
    arrivals: list[tuple[int, float]],
    clock: Callable[[], float],
    until: float | None,
    max_live: int | None,
    start: Callable[[int, float], ArrivingSession],
    tasks: list[asyncio.Task[bool]],
) -> None:
    """For each arrival (k, t) before `until` (the time limit), `start(k, t)` makes conversation k (1-based)
    PREPARE_AHEAD_S before it; it prepares, arrives at t, and runs once a --max-live slot is free. Its task
    joins `tasks` (the time limit's grace cancels them); returns once every arrival before `until` has been
    made (the caller waits for `tasks` to end)."""
    slots = asyncio.Semaphore(max_live or len(arrivals) or 1)

    async def arriving(conversation: ArrivingSession, at: float) -> bool:
        run = None
        try:
            await conversation.prepare()
            await asyncio.sleep(max(0.0, at - clock()))
            run = conversation.arrive()
            async with slots:
                return await run()
        finally:
            if run is None:
                conversation.abandon()

    for k, at in arrivals:
        if until is not None and at >= until:
            break
        await asyncio.sleep(max(0.0, at - PREPARE_AHEAD_S - clock()))
        tasks.append(asyncio.create_task(arriving(start(k, at), at)))
