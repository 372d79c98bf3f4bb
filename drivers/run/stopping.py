"""How a run's sessions are waited for and stopped: all of them to their end, --time-limit (no new turn, then
--grace for those in flight) and an early stop (a sweep point's saturated server). One job: the run's end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.pacing import TurnGate


async def wait_all(tasks: list[asyncio.Task[bool]]) -> None:
    """Wait for every session; a session that raised (a bug) ends the wait at
    once, and a session cancelled by the time limit's grace is not an error."""
    if not tasks:
        return
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


async def time_limit(
    limit: float,
    grace: float,
    clock: Callable[[], float],
    emit: Callable[[ev.AnyEvent], None],
    gate: TurnGate,
    tasks: list[asyncio.Task[bool]],
) -> None:
    """At --time-limit no new turn starts; after --grace, turns in flight are cancelled."""
    await asyncio.sleep(max(0.0, limit - clock()))
    gate.expire()
    waits = f"; turns in flight get {grace:g}s more" if grace > 0 else "; turns in flight finish"
    emit(ev.Notice(t=clock(), level="warn", message=f"time limit {limit:g}s reached: no new turns{waits}"))
    if grace > 0:
        await asyncio.sleep(grace)
        for t in tasks:
            t.cancel()


async def stop_early(
    stop_when: Callable[[RunState], str | None],
    state: RunState,
    clock: Callable[[], float],
    emit: Callable[[ev.AnyEvent], None],
    gate: TurnGate,
    tasks: list[asyncio.Task[bool]],
    arriving: asyncio.Task | None,
    stopped: Callable[[str], None],
) -> None:
    """Once a second, ask `stop_when`; when it gives a reason (handed to `stopped`), no new conversation or turn
    starts and the turns in flight are cancelled (a saturated server would take long to drain, and only the
    queue would grow)."""
    while (reason := stop_when(state)) is None:
        await asyncio.sleep(1.0)
    stopped(reason)
    gate.expire()
    emit(ev.Notice(t=clock(), level="warn", message=f"stopping early: {reason}"))
    for t in (arriving, *tasks):
        if t is not None:
            t.cancel()
