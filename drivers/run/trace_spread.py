"""--trace with --workers N or --cluster: the coordinator alone reads the trace (a worker on another node needs
no copy of it) and hands each request to its session's worker just before it is due. The trace's k-th session by
first appearance runs on worker (k-1) mod N, all its turns there, as a ramp's session k does (shards.worker_of)."""

from __future__ import annotations

import asyncio
from collections import deque
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


class _Handed:
    """A session handed out: what it needs to go on elsewhere should its worker be lost (--workers-restart)."""

    def __init__(self, k: int, first: TraceRequest, origin: float, schedule: list[int], slot: int):
        self.k, self.first, self.origin, self.schedule, self.slot = k, first, origin, schedule, slot
        self.worker: int | None = None  # the worker it was last handed to (None: held for its slot's next one)
        self.requests: deque[TraceRequest] = deque()  # handed on and, as far as its worker said, not done
        self.ended = False  # its last request was handed on
        self.previous: tuple[float, float] | None = None  # its last turn done: (due in the trace, end)
        self.said: list[tuple[str, str]] = []  # a text trace's conversation, as its worker kept it (TraceSaid)
        self.announced = False  # a worker announced it (SessionPlanned): it goes on elsewhere, never starts over

    def seen_announced(self, pool: WorkerPool, session: str) -> bool:
        """Whether it was announced, by its last worker (the pool saw its SessionPlanned) or before."""
        if not self.announced and self.worker is not None:
            self.announced = session in pool.workers[self.worker].planned
        return self.announced


class WorkerSessions:
    """TraceReplay.dispatch's sessions, each handed to its slot's worker: the trace's k-th to slot (k-1) mod N.

    A slot's worker lost with --workers-restart is replaced: until the replacement has begun, what is due to its
    sessions is held; then each goes on there at its first request not done (TraceResume, or from its start if it
    had not begun). A slot whose line of workers ends takes no more sessions: those it had not announced and those
    due later are counted (`unstarted`, by the last worker lost on the slot)."""

    def __init__(self, pool: WorkerPool, prompts: ww.TraceStart):
        self.pool, self.prompts = pool, prompts
        self.handed: dict[str, _Handed] = {}  # each session handed out and not yet ended on its worker
        self.at: dict[int, int | None] = {slot: slot for slot in range(pool.n)}  # slot -> its worker (None: held)
        self.unstarted: dict[int, list[str]] = {}  # by lost worker: its sessions that will not start
        self.started = [0] * pool.n  # each slot's sessions started: its share's first so many, by first appearance
        self.gone: dict[int, int] = {}  # slot -> the worker whose loss ended its line
        self.over = False  # every request was handed on

    def start(self, k: int, first: TraceRequest, origin: float, schedule: list[int]) -> None:
        slot = worker_of(k, self.pool.n)
        self.started[slot] += 1
        if slot in self.gone:
            self.unstarted.setdefault(self.gone[slot], []).append(first.session)
            return
        h = self.handed[first.session] = _Handed(k, first, origin, schedule, slot)
        self._to(h, ww.TraceSession(k=k, origin=origin, schedule=schedule, first=first))

    def turn(self, request: TraceRequest) -> None:
        h = self.handed.get(request.session)
        if h is not None:
            self._trim(request.session, h)
            h.requests.append(request)
            self._to(h, ww.TraceTurn(request))

    def end(self, session: str) -> None:
        h = self.handed.get(session)
        if h is not None:
            h.ended = True
            self._to(h, ww.TraceEnd(session))

    def finish(self) -> None:
        """No more requests: each running worker is told so, and a replacement once it has its sessions."""
        self.over = True
        for index in self.at.values():
            if index is not None:
                self.pool.send_to(index, ww.TraceOver())

    def _to(self, h: _Handed, message: object) -> None:
        index = self.at.get(h.slot)
        if index is not None and self.pool.send_to(index, message):
            h.worker = index

    def _trim(self, session: str, h: _Handed) -> None:
        """Let go of the requests its worker has done (or lost): a replacement starts after them."""
        if h.worker is None:
            return
        w = self.pool.workers[h.worker]
        done = w.ended.get(session, 0)
        last = None
        while h.requests and h.requests[0].turn <= done:
            last = h.requests.popleft()
        if last is not None and session in w.ended_at:
            h.previous = (last.due_s, w.ended_at[session])

    # -- what the pool tells of its workers (--workers-restart) -------------------------------------------------

    def goes_on(self, slot: int) -> bool:
        """Whether a lost worker of `slot` leaves anything to go on with: sessions of its, now or to come."""
        return bool(self.names(slot))

    def names(self, slot: int) -> list[str]:
        """The slot's sessions a replacement goes on with: those handed out and not ended, then those to come."""
        share = self.pool.session_names[slot] if self.pool.session_names is not None else []
        return self._of(slot) + share[self.started[slot] :]

    def _of(self, slot: int) -> list[str]:
        return [sid for sid, h in self.handed.items() if h.slot == slot]

    def lost(self, slot: int, worker: int, replaced: bool) -> list[str]:
        """The slot's worker `worker` was lost: hold what is due to it for its replacement, or end its sessions.
        Ended: those announced (the pool names them lost), the others counted as not started."""
        if replaced:
            self.at[slot] = None
            return []
        self.at.pop(slot, None)
        self.gone[slot] = worker
        announced = []
        for sid in self._of(slot):
            h = self.handed.pop(sid)
            if h.seen_announced(self.pool, sid):
                announced.append(sid)
            else:
                self.unstarted.setdefault(worker, []).append(sid)
        return announced

    def ready(self, slot: int, index: int) -> None:
        """The slot's replacement has begun: the prompts' makings, then each of the slot's sessions at its first
        request not done (a session a lost worker had announced goes on; one none had starts over)."""
        if slot not in self.at or self.at[slot] is not None:
            return  # (a replacement lost while it was introduced: the slot went on without it)
        self.at[slot] = index
        self.pool.send_to(index, self.prompts)
        for sid in self._of(slot):
            h = self.handed[sid]
            self._trim(sid, h)
            if h.seen_announced(self.pool, sid):
                resume = ww.TraceResume(k=h.k, session=sid, origin=h.origin, previous=h.previous, said=h.said)
                self._to(h, resume)
            else:
                self._to(h, ww.TraceSession(k=h.k, origin=h.origin, schedule=h.schedule, first=h.first))
            for request in h.requests:
                self._to(h, ww.TraceTurn(request))
            if h.ended:
                self._to(h, ww.TraceEnd(sid))
        if self.over:
            self.pool.send_to(index, ww.TraceOver())

    def left(self, session: str) -> None:
        """The session ended on its worker: nothing of it is left to resume."""
        self.handed.pop(session, None)

    def said(self, kept: ww.TraceSaid) -> None:
        h = self.handed.get(kept.session)
        if h is not None:
            h.said += kept.said


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
    sessions = pool.trace = WorkerSessions(pool, prompts_message(trace.prompts))  # told of lost workers from now
    begun = asyncio.ensure_future(pool.begun.wait())
    try:
        await asyncio.wait([begun, running], return_when=asyncio.FIRST_COMPLETED)
    finally:
        begun.cancel()
    if not pool.begun.is_set():
        return
    pool.send_all(sessions.prompts)
    try:
        await trace.dispatch(sessions, clock, time_scale, until)
    finally:
        sessions.finish()
        for w, names in sorted(sessions.unstarted.items()):  # never dropped unsaid
            listed = ", ".join(names[:8]) + ("…" if len(names) > 8 else "")
            message = (
                f"worker {w} lost: trace sessions due to start on it later were not started: {len(names)} ({listed})"
            )
            pool.emit(ev.Notice(t=clock(), level="error", message=message))
