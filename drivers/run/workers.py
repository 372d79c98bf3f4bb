"""The coordinator's side of --workers N: start the driver workers, give each its share of the sessions, set
their clocks to the run's, hold the lockstep barrier for all of them, pass their events on, and account for a
worker that dies (--workers-restart: replace it, its sessions going on at their next turn with the history each
turn's TurnKept brought; a trace's, with what trace_spread.WorkerSessions holds of them). The coordinator (the
Run) alone probes, scrapes, receives spans and records.

A worker is reached through a link (a process over its stdin/stdout, local_worker.py; a Ray actor, ray_workers.py)
that sends it messages and hands back its lines."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Protocol

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.workers import LOST
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.shards import sessions_of
from rampwatch.drivers.run.worker_clocks import WorkerClocks, WorkerUnreachable
from rampwatch.drivers.run.worker_histories import SessionHistories

START_WAIT_S = 60.0  # how long a worker may take to start and say Hello
STOP_WAIT_S = 30.0  # how long stopping workers may take to cancel their turns and send what they have
RELEASE_S = 0.02  # lockstep: the barrier's counts name a time this far ahead, at which every worker lets go
RESTARTS = 3  # --workers-restart: a worker's line is replaced this many times at most (one that keeps dying ends)


class WorkerLink(Protocol):
    """One worker, however it is reached."""

    def start(self, message: ww.WorkerStart, on_line: Callable[[bytes], None], on_exit: Callable[[str], None]) -> None:
        """Start it with `message`; its lines go to `on_line`; `on_exit(why)` once it is gone."""

    def send(self, message: object) -> None: ...

    def kill(self) -> None: ...

    def stderr_tail(self) -> str: ...


class TraceHandOut(Protocol):
    """--trace: where the coordinator hands the trace's sessions out to the workers' slots (trace_spread.py), told
    what it must know to go on with a lost worker's sessions elsewhere (--workers-restart)."""

    def goes_on(self, slot: int) -> bool:
        """Whether a lost worker of `slot` leaves anything to go on with."""

    def names(self, slot: int) -> list[str]:
        """The slot's sessions, for its replacement's WorkerStarted."""

    def lost(self, slot: int, worker: int, replaced: bool) -> list[str]:
        """Worker `worker` of `slot` was lost: the sessions announced that end with it (none if `replaced`)."""

    def ready(self, slot: int, index: int) -> None:
        """The slot's replacement, worker `index`, has begun: its sessions go on there."""

    def left(self, session: str) -> None:
        """The session has ended on its worker."""

    def said(self, kept: ww.TraceSaid) -> None: ...


class _Worker:
    """What the coordinator knows of one worker."""

    def __init__(self, index: int, link: WorkerLink, sessions: list[int], resume: list[ww.SessionResume] = ()):
        self.index, self.link, self.sessions, self.resume = index, link, sessions, list(resume)
        self.live = {f"s{k}" for k in sessions}  # its sessions that have not ended (closed loop: all, at first)
        self.live |= {f"s{r.session}" for r in self.resume}
        self.joined: set[str] = set()  # open loop: its sessions that have arrived
        self.in_flight: dict[tuple[str, int], None] = {}  # its turns sent and not done
        # Each session's last turn done (TurnDone) or lost in flight, and its last counted at the barrier
        # (GateAfter): a resumed session's from the turn before the one it goes on at, should it be lost again.
        self.ended = {f"s{r.session}": r.turn - 1 for r in self.resume}
        self.ended_at: dict[str, float] = {}  # ... and when (--trace: a resumed session's next turn is timed from it)
        self.planned: set[str] = set()  # --trace: its sessions announced (SessionPlanned): one resumed is not again
        self.passed = dict(self.ended)
        self.slot = index  # where it runs (a Ray node): a replacement takes its lost worker's
        self.generation = 0  # how many lost workers came before it in its line (--workers-restart)
        self.hello: asyncio.Future[ww.Hello] = asyncio.get_running_loop().create_future()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pongs: dict[int, asyncio.Future[float]] = {}
        self.origin: float | None = None  # the run's t = 0 on its clock (None: not set yet)
        self.through = -math.inf  # every event it sent before its latest ww.Through is stamped at most this
        self.lost = False


class WorkerPool:
    """Drives a run's sessions on N workers; `run()` returns once every worker finished or was lost, and a
    cancellation stops them (their turns in flight end cancelled). `failed`: a worker had a failed turn, or was
    lost."""

    def __init__(
        self,
        cfg: RunConfig,
        plan: ww.SessionPlan,
        emit: Callable[..., None],
        clock: Callable[[], float],
        gate: TurnGate,
        links: Callable[[int], WorkerLink],
        workers: int,
        arrivals: Callable[[], list[float] | None] = lambda: None,
    ):
        """`links(i)` reaches worker i; `arrivals()`, asked as the workers begin, gives an open loop's arrival
        times on the run's clock (None: a closed loop)."""
        self.cfg, self.plan, self.emit, self.clock, self.gate = cfg, plan, emit, clock, gate
        self.links, self.n, self.arrivals = links, workers, arrivals
        self.failed = False
        self.workers: list[_Worker] = []
        self.clocks = WorkerClocks(emit, clock)
        self.time_limit_at: float | None = cfg.time_limit  # no new conversation after it (open loop)
        self._closed = False  # run() has returned: a worker's exit now is ours (killed at the end), not a loss
        self.begun = asyncio.Event()  # every worker was told Begin: a trace's requests may go to them, and a lost
        # worker may be replaced (--workers-restart)
        self._stopping = False  # told to stop: a lost worker is not replaced
        self._arrivals: list[float] | None = None  # an open loop's arrival times, for a replacement's Begin
        self.histories = SessionHistories()  # --workers-restart: each live session's, as its worker kept it
        self._replacing: set[asyncio.Future[None]] = set()  # replacements starting
        self.session_names: list[list[str]] | None = None  # --trace: each worker's sessions, as WorkerStarted names
        self.trace: TraceHandOut | None = None  # --trace: where its requests are handed out, told of lost workers
        gate.listeners.append(self._gate_changed)

    # -- the run ------------------------------------------------------------------

    async def run(self) -> bool:
        clocks: asyncio.Task | None = None
        started = False
        try:
            await self._start()
            started = True
            clocks = asyncio.create_task(self.clocks.keep(self.workers))
            # asyncio.wait, not gather: a cancelled gather cancels the futures it waits on, and _stop would then
            # find every worker done and wait for none of them to send its cancelled turns. In a loop: a lost
            # worker's replacement joins the workers while they run.
            while pending := [w.done for w in self.workers if not w.done.done()]:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._stop()
            raise
        finally:
            if clocks is not None:
                clocks.cancel()
            for task in list(self._replacing):
                task.cancel()
            for w in self.workers:
                if started and not w.done.done():  # not stopped when asked (or a replacement still starting): lost
                    late = f"did not stop within {STOP_WAIT_S:g}s" if w.hello.done() else "was still starting"
                    self._on_exit(w, f"{late} and was killed")
                w.link.kill()
            self._closed = True
        return not self.failed

    async def _start(self) -> None:
        for i in range(self.n):
            sessions = sessions_of(i, self.n, self.plan.sessions)
            w = _Worker(i, self.links(i), sessions)
            self.workers.append(w)
            message = ww.WorkerStart(
                config=self.cfg,
                plan=self.plan,
                worker=i,
                workers=self.n,
                sessions=sessions,
                time_limit_at=self.time_limit_at,
                schema=ev.SCHEMA,
            )
            w.link.start(message, lambda line, w=w: self._on_line(w, line), lambda why, w=w: self._on_exit(w, why))
        for w in self.workers:
            done, _ = await asyncio.wait([w.hello, w.done], timeout=START_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
            if w.hello not in done:
                tail = w.link.stderr_tail()
                raise RuntimeError(f"worker {w.index} did not start" + (f": {tail}" if tail else ""))
        for w in self.workers:
            await self._introduce(w)
        self._arrivals = arrivals = self.arrivals()
        for w in self.workers:
            self._let_go(w, arrivals)
        self.begun.set()

    async def _introduce(self, w: _Worker, replaces: int | None = None) -> None:
        """Set a worker's clock to the run's and record it started, with the sessions it runs."""
        hello = w.hello.result()
        if hello.schema > ev.SCHEMA:
            raise RuntimeError(f"worker {w.index} on {hello.node}: {ww.versions_differ(hello.schema, ev.SCHEMA)}")
        w.origin = await self.clocks.set(w)
        if self.session_names is not None and replaces is None:
            names = self.session_names[w.index]
        elif self.trace is not None:
            names = self.trace.names(w.slot)  # the sessions it goes on with (more may start on it)
        else:
            names = [f"s{k}" for k in w.sessions] + [f"s{r.session}" for r in w.resume]
        started = ev.WorkerStarted(
            t=self.clock(), worker=w.index, pid=hello.pid, node=hello.node, sessions=names, replaces=replaces
        )
        self.emit(started)
        await self.clocks.measure(w)  # while it is idle: the clock as set, before its sessions load it

    def _let_go(self, w: _Worker, arrivals: list[float] | None) -> None:
        """The barrier's counts its sessions will ask (a resumed session's, of the turn before its own), then
        Begin: its sessions start."""
        if arrivals is not None and not w.resume:
            w.live.clear()  # an open loop's sessions count once they arrive (GateJoin)
        w.link.send(self._gate_state(0))
        for turn in sorted({r.turn - 1 for r in w.resume if r.turn > 1}):
            w.link.send(self._gate_state(turn))
        assert w.origin is not None  # introduced first
        w.link.send(ww.Begin(origin=w.origin, arrivals=arrivals))

    async def _stop(self) -> None:
        """Tell every worker to cancel its turns and finish; kill what has not within STOP_WAIT_S."""
        self._stopping = True
        for w in self.workers:
            w.link.send(ww.Stop())
        pending = [w.done for w in self.workers if not w.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=STOP_WAIT_S)

    # -- what the workers say -----------------------------------------------------

    def _on_line(self, w: _Worker, line: bytes) -> None:
        if self._closed or w.lost:
            return  # what a worker says once it is counted lost, or once the run has ended, is not the run's
        try:
            message = ww.decode_from_worker(line)
        except Exception as e:  # noqa: BLE001 - one bad line is said, never the end of the run
            self.emit(ev.Notice(t=self.clock(), level="error", message=f"worker {w.index}: unreadable line ({e})"))
            return
        if isinstance(message, ev.Event):
            if isinstance(message, ev.RequestSent):
                w.in_flight[(message.session, message.turn)] = None
            elif isinstance(message, ev.TurnDone):
                w.in_flight.pop((message.session, message.turn), None)
                w.ended[message.session] = message.turn
                w.ended_at[message.session] = message.t
            elif self.trace is not None and isinstance(message, ev.SessionPlanned):
                w.planned.add(message.session)
            self.emit(message, line)  # recorded as the worker encoded it
        elif isinstance(message, ww.GateAfter):
            w.passed[message.session] = message.turn
            self.gate.after(message.turn)
        elif isinstance(message, ww.TurnKept):
            self.histories.keep(message)
        elif isinstance(message, ww.GateJoin):
            w.live.add(message.session)
            w.joined.add(message.session)
            self.gate.join()
        elif isinstance(message, ww.GateLeave):
            if message.session in w.live:
                w.live.discard(message.session)
                self.histories.forget(message.session)  # it has ended: nothing left to resume
                if self.trace is not None:
                    self.trace.left(message.session)
                    w.planned.discard(message.session)
                    w.ended_at.pop(message.session, None)
                self.gate.leave()
        elif isinstance(message, ww.TraceSaid):
            if self.trace is not None:
                self.trace.said(message)
        elif isinstance(message, ww.Pong):
            pong = w.pongs.get(message.n)
            if pong is not None and not pong.done():
                pong.set_result(message.clock)
        elif isinstance(message, ww.Hello):
            if not w.hello.done():
                w.hello.set_result(message)
        elif isinstance(message, ww.Through):
            w.through = max(w.through, message.t)
        elif isinstance(message, ww.WorkerDone):
            self.failed |= message.failed
            if not w.done.done():
                w.done.set_result(None)

    def _on_exit(self, w: _Worker, why: str) -> None:
        """The worker's process is gone: if it had not finished, it was lost, and so are its turns in flight;
        with --workers-restart its sessions go on, each at its next turn, on a replacement."""
        if w.done.done() or self._closed:
            return
        tail = w.link.stderr_tail()
        reason = why + (f": {tail}" if tail and "killed" not in why else "")
        t = self.clock()
        for session, turn in list(w.in_flight):
            self.emit(ev.TurnDone(t=t, session=session, turn=turn, status="failed", error=LOST))
            w.ended[session] = max(w.ended.get(session, 0), turn)
            w.ended_at[session] = t
        lost = sorted(w.live, key=lambda s: self._session_order(w, s))
        trace = self.trace  # a trace's sessions, and those to start on it, go on as its hand-out says
        resumes = self._resumes(w, lost) if self.cfg.workers_restart and trace is None else []
        # An open loop's sessions still to arrive on it (a trace's are the trace dispatch's to say).
        unarrived = [k for k in w.sessions if f"s{k}" not in w.joined] if self._arrivals is not None else []
        goes_on = resumes or unarrived or (trace is not None and trace.goes_on(w.slot))
        replacement = None
        if goes_on and self.cfg.workers_restart and self._may_replace(w):
            replacement = _Worker(len(self.workers), self.links(w.slot), unarrived, resumes)
            replacement.slot, replacement.generation = w.slot, w.generation + 1
            if self._arrivals is not None:  # those to come count at the barrier once they arrive (GateJoin)
                replacement.live = {f"s{r.session}" for r in resumes}
        named = lost  # ... and a trace's that it was handed while it started (a replacement that never began)
        if trace is not None:  # a replacement's sessions join the barrier anew as they start on it
            named = lost + [s for s in trace.lost(w.slot, w.index, replacement is not None) if s not in w.live]
        turns = len(w.in_flight)
        where = f"each goes on at its next turn on worker {replacement.index}" if replacement else "each ends"
        resumed_on = replacement.index if replacement else None
        self.emit(
            ev.WorkerLost(t=t, worker=w.index, reason=reason, sessions=named, turns_lost=turns, resumed_on=resumed_on)
        )
        shown = f"{', '.join(named[:8])}{'…' if len(named) > 8 else ''}"
        message = (
            f"worker {w.index} lost ({reason}): {counted(turns, 'turn')} in flight failed; "
            f"{counted(len(named), 'session')} ({shown}): " + where
        )
        self.emit(ev.Notice(t=t, level="error", message=message))
        if unarrived and replacement is None:  # never dropped unsaid
            names = [f"s{k}" for k in unarrived]
            listed = ", ".join(names[:8]) + ("…" if len(names) > 8 else "")
            message = f"worker {w.index} lost: sessions due to arrive on it later do not start: {len(names)} ({listed})"
            self.emit(ev.Notice(t=t, level="error", message=message))
        w.in_flight.clear()
        resumed = {f"s{r.session}" for r in resumes} if replacement else set()
        for session in lost:
            if session in resumed:  # it stays at the barrier: the turn it lost counts as finished there
                for turn in range(w.passed.get(session, 0) + 1, w.ended.get(session, 0) + 1):
                    self.gate.after(turn)
            else:
                self.histories.forget(session)
                self.gate.leave()
        w.live.clear()
        w.lost = True
        self.failed = True
        w.done.set_result(None)
        if replacement is not None:
            self.workers.append(replacement)
            task = asyncio.ensure_future(self._replace(replacement, w.index))
            self._replacing.add(task)
            task.add_done_callback(self._replacing.discard)

    def _resumes(self, w: _Worker, lost: list[str]) -> list[ww.SessionResume]:
        """What a replacement of `w` would go on with: its live ramp sessions (s<k>), each from its next turn, with
        its history as kept (not those whose last turn it was)."""
        last = len(self.cfg.schedule)
        resumes = []
        for session in lost:
            turn = max(w.ended.get(session, 0), w.passed.get(session, 0)) + 1
            if turn <= last and session[1:].isdigit():
                resumes.append(self.histories.resume(session, turn))
        return resumes

    def _may_replace(self, w: _Worker) -> bool:
        """Whether a lost worker is replaced: not once the run is stopping, and not one that never started (a
        replacement on a node that is gone would only fail again)."""
        if not self.begun.is_set() or self._stopping or self.gate.time_up:
            return False
        if not w.hello.done():
            return False
        if w.generation >= RESTARTS:
            message = f"worker {w.index} is not replaced: its line of workers was lost {RESTARTS + 1} times"
            self.emit(ev.Notice(t=self.clock(), level="error", message=message))
            return False
        return True

    async def _replace(self, w: _Worker, replaces: int) -> None:
        """Start a lost worker's replacement and let its sessions go on; one that does not start is lost too."""
        message = ww.WorkerStart(
            config=self.cfg,
            plan=self.plan,
            worker=w.index,
            workers=self.n,
            sessions=w.sessions,
            time_limit_at=self.time_limit_at,
            resume=w.resume,
            schema=ev.SCHEMA,
        )
        try:
            w.link.start(message, lambda line: self._on_line(w, line), lambda why: self._on_exit(w, why))
            done, _ = await asyncio.wait([w.hello, w.done], timeout=START_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
            if w.hello not in done:
                raise WorkerUnreachable(f"no Hello within {START_WAIT_S:g}s")
            await self._introduce(w, replaces)
            if w.done.done():
                return  # lost while it was introduced: its exit said so, and the slot went on without it
        except Exception as e:  # noqa: BLE001 - a replacement that cannot start is lost, never the run's end
            w.link.kill()
            self._on_exit(w, f"did not start ({e})")
            return
        if self._stopping:  # the run was stopped while it started: it starts nothing
            w.link.send(ww.Stop())
            return
        self._let_go(w, self._arrivals)
        if self.trace is not None:
            self.trace.ready(w.slot, w.index)

    def _gate_changed(self, turn: int) -> None:
        """The run-wide barrier moved: every worker hears its counts (a turn's count only in lockstep, where a
        session waits on it; the time limit always)."""
        if turn and not self.gate.lockstep:
            return
        state = self._gate_state(turn)
        for w in self.workers:
            if not w.done.done():
                w.link.send(state)

    def _gate_state(self, turn: int) -> ww.GateState:
        gate = self.gate
        finished = gate.finished(turn) if turn else 0
        at = self.clock() + RELEASE_S  # every worker hears it within this, and all go at once
        return ww.GateState(live=gate.live, turn=turn, finished=finished, time_up=gate.time_up, release_at=at)

    def through(self) -> float:
        """The time up to which every running worker has sent its events (inf: none is running, or has said)."""
        running = (w.through for w in self.workers if not w.done.done() and w.through > -math.inf)
        return min(running, default=math.inf)

    # -- a trace's requests (--trace: the coordinator reads it and hands them out, trace_spread.py) ---------------

    def send_to(self, index: int, message: object) -> bool:
        """A message to worker `index`, unless it has finished or was lost (False: not sent)."""
        w = self.workers[index]
        if w.done.done():
            return False
        w.link.send(message)
        return True

    def send_all(self, message: object) -> None:
        for w in self.workers:
            self.send_to(w.index, message)

    def _session_order(self, w: _Worker, session: str) -> int:
        """Where a worker's session stands among its others: session k's k; a trace's, its first appearance."""
        if self.session_names is not None:
            names = self.session_names[w.slot]
            return names.index(session) if session in names else len(names)
        return int(session[1:]) if session[1:].isdigit() else 0
