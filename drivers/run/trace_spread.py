"""--trace with --workers N or --cluster: the coordinator alone reads the trace (a worker on another node needs
no copy of it) and hands each request to its session's worker just before it is due. The trace's k-th session by
first appearance runs on worker (k-1) mod N, all its turns there, as a ramp's session k does (shards.worker_of)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from rampwatch.drivers.client.trace_prompt import TracePrompts
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.trace import TraceRequest
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.shards import worker_of

if TYPE_CHECKING:
    from rampwatch.drivers.run.trace_run import TraceReplay
    from rampwatch.drivers.run.workers import WorkerPool


def trace_shares(sessions: list[str], workers: int) -> list[list[str]]:
    """Each worker's trace sessions, of `sessions` in order of first appearance."""
    shares: list[list[str]] = [[] for _ in range(workers)]
    for k, sid in enumerate(sessions, start=1):
        shares[worker_of(k, workers)].append(sid)
    return shares


def prompts_message(prompts: TracePrompts) -> ww.TraceStart:
    return ww.TraceStart(
        atoms=prompts.atoms,
        salt=prompts.salt,
        block_size=prompts.block_size,
        template=prompts.template,
        chat=prompts.chat,
    )


class WorkerSessions:
    """TraceReplay.dispatch's sessions, each handed to its worker of the pool's; a session whose worker was lost
    before it started is not started, and counted (`unstarted`)."""

    def __init__(self, pool: WorkerPool):
        self.pool = pool
        self.where: dict[str, int] = {}  # each live session's worker
        self.unstarted: dict[int, list[str]] = {}  # a lost worker's sessions that were due to start after it

    def start(self, k: int, first: TraceRequest, origin: float, schedule: list[int]) -> None:
        w = worker_of(k, self.pool.n)
        if self.pool.send_to(w, ww.TraceSession(k=k, origin=origin, schedule=schedule, first=first)):
            self.where[first.session] = w
        else:
            self.unstarted.setdefault(w, []).append(first.session)

    def turn(self, request: TraceRequest) -> None:
        w = self.where.get(request.session)
        if w is not None:
            self.pool.send_to(w, ww.TraceTurn(request))

    def end(self, session: str) -> None:
        w = self.where.pop(session, None)
        if w is not None:
            self.pool.send_to(w, ww.TraceEnd(session))


async def replay_on_workers(
    trace: TraceReplay,
    pool: WorkerPool,
    running: asyncio.Task,
    clock: Callable[[], float],
    time_scale: float,
    until: float | None,
) -> None:
    """Once every worker has begun (or `running`, the pool's run, ended first: nothing to hand out), give them the
    prompts' makings and then the trace's requests; TraceOver to all at the end, however it ends, so each worker
    finishes once its sessions have."""
    assert trace.prompts is not None
    begun = asyncio.ensure_future(pool.begun.wait())
    try:
        await asyncio.wait([begun, running], return_when=asyncio.FIRST_COMPLETED)
    finally:
        begun.cancel()
    if not pool.begun.is_set():
        return
    pool.send_all(prompts_message(trace.prompts))
    sessions = WorkerSessions(pool)
    try:
        await trace.dispatch(sessions, clock, time_scale, until)
    finally:
        pool.send_all(ww.TraceOver())
        for w, names in sorted(sessions.unstarted.items()):  # never dropped unsaid
            listed = ", ".join(names[:8]) + ("…" if len(names) > 8 else "")
            message = (
                f"worker {w} lost: trace sessions due to start on it later were not started: {len(names)} ({listed})"
            )
            pool.emit(ev.Notice(t=clock(), level="error", message=message))
