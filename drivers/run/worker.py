"""A driver worker (--workers N): `python -m rampwatch.drivers.run.worker`, one of N processes that each drive
a share of a run's sessions behind one coordinator (drivers/run/workers.py), which alone probes, scrapes,
records and shows. Its stamps are taken on its own event loop, so N workers stream N times what one loop can.

It reads WorkerStart from stdin, says Hello, answers the clock exchange, and once told Begin (the run's t = 0 on
its own clock) runs its sessions: the same sessions, prompts and sizes the one driver would make for them
(session_maker.py), at the run-wide lockstep barrier (RemoteGate). Its events go to stdout as the recording has
them, with its id on its sessions' plans and its loop-lag reports. It dies with the coordinator (lifetime).
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # as in child.py: no CLI imports

import asyncio  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable  # noqa: E402

import httpx  # noqa: E402
import msgspec  # noqa: E402

from rampwatch.drivers.client.session import SessionRunner  # noqa: E402
from rampwatch.drivers.model import events as ev  # noqa: E402
from rampwatch.drivers.model.clock import RunClock  # noqa: E402
from rampwatch.drivers.net.tls import tls_context  # noqa: E402
from rampwatch.drivers.run import lifetime, pipe  # noqa: E402
from rampwatch.drivers.run import worker_wire as ww  # noqa: E402
from rampwatch.drivers.run.arrivals import ArrivingSession, run_arrivals  # noqa: E402
from rampwatch.drivers.run.loop_lag import LoopLagMonitor  # noqa: E402
from rampwatch.drivers.run.memory import keep_survivors_frozen, set_up_heap_frozen  # noqa: E402
from rampwatch.drivers.run.prompt_shape import load_corpus  # noqa: E402
from rampwatch.drivers.run.session_maker import SessionMaker, session_client  # noqa: E402
from rampwatch.drivers.run.stopping import wait_all  # noqa: E402
from rampwatch.drivers.run.trace_worker import TraceMessage, WorkerTrace  # noqa: E402

_encode = msgspec.json.Encoder().encode
THROUGH_EVERY_S = 0.05  # how often a worker says up to when it has sent its events (ww.Through): as its pipe flushes


class RemoteGate:
    """The run-wide TurnGate as this worker sees it: its sessions' arrivals at the barrier go to the coordinator,
    whose gate counts every worker's; its counts come back (GateState), and a session waits on them."""

    def __init__(self, send: Callable[[object], None], lockstep: bool, clock: Callable[[], float]):
        self.send, self.lockstep, self.clock = send, lockstep, clock
        self.live = 0
        self.time_up = False
        self._release_at = 0.0  # the latest counts' time to go, on the run's clock (the same on every worker)
        self._finished: Counter[int] = Counter()
        self._changed = asyncio.Event()

    def update(self, state: ww.GateState) -> None:
        self.live, self.time_up, self._release_at = state.live, state.time_up, state.release_at
        if state.turn:
            self._finished[state.turn] = state.finished
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def before(self, turn: int) -> bool:
        if self.lockstep and turn > 1:
            while not (self.time_up or self._finished[turn - 1] >= self.live):
                await self._changed.wait()
            # Every worker heard the counts that opened the barrier at its own moment: all go at the time they
            # carry, so the sessions start together whatever the delivery took.
            wait = self._release_at - self.clock()
            if wait > 0 and not self.time_up:
                await asyncio.sleep(wait)
        return not self.time_up

    def after(self, turn: int, session: str = "") -> None:
        self.send(ww.GateAfter(turn=turn, session=session))

    def join(self, session: str = "") -> None:
        self.send(ww.GateJoin(session=session))

    def leave(self, session: str = "") -> None:
        self.send(ww.GateLeave(session=session))


class _SessionGate:
    """One session's view of the RemoteGate: it names the session at the barrier (the coordinator keeps each
    worker's live sessions and the turns they passed, to end or resume them if the worker is lost) and, with
    --workers-restart, sends what each turn added to its history (TurnKept) before it passes."""

    def __init__(self, gate: RemoteGate, sid: str, keep: bool = False, kept: int = 0):
        self.gate, self.sid = gate, sid
        self.runner: SessionRunner | None = None  # set once made: whose history `after` sends (keep)
        self.keep, self.kept = keep, kept  # kept: its history's messages the coordinator has already

    @property
    def time_up(self) -> bool:
        return self.gate.time_up

    async def before(self, turn: int) -> bool:
        return await self.gate.before(turn)

    def after(self, turn: int) -> None:
        r = self.runner
        if self.keep and r is not None:
            added = [m.decode() for m in r.history[self.kept :]]
            self.kept = len(r.history)
            self.gate.send(ww.TurnKept(session=self.sid, turn=turn, added=added, state=r.conv.state()))
        self.gate.after(turn, self.sid)

    def join(self) -> None:
        self.gate.join(self.sid)

    def leave(self) -> None:
        self.gate.leave(self.sid)


class ShardDriver:
    """Drives one worker's sessions; `send` takes each line for the coordinator (events and replies)."""

    def __init__(self, start: ww.WorkerStart, write_line: Callable[[bytes], None], flush: Callable[[], None]):
        self.start, self.cfg, self.worker = start, start.config, start.worker
        self.write_line, self.flush = write_line, flush
        self.clock = RunClock()  # its origin is the coordinator's t = 0, set at Begin
        self.gate = RemoteGate(self.send, self.cfg.lockstep, self.clock)
        self.begun = asyncio.Event()
        self.tasks: list[asyncio.Task[bool]] = []
        self.runners: list[SessionRunner] = []
        self._clients: list[httpx.AsyncClient] = []
        self._arriving: asyncio.Future[None] | None = None  # an open loop's arrivals, until stopped
        self._stopped = False
        self.arrivals: list[float] | None = None  # open loop: every session's arrival (Begin's)
        self.node = socket.gethostname()  # its Hello's; a Ray actor's names its Ray node too
        self.trace = self._trace_sessions() if self.cfg.trace is not None else None  # --trace: handed out to it

    def send(self, message: object) -> None:
        """A control message: written at once (the barrier and the clock exchange wait on it)."""
        self.write_line(ww.encode(message))
        self.flush()

    def emit(self, e: ev.AnyEvent) -> None:
        if isinstance(e, ev.SessionPlanned):
            e.worker = self.worker
        self.write_line(_encode(e))

    def command(self, message: ww.ToWorker) -> None:
        if isinstance(message, ww.Ping):
            self.send(ww.Pong(n=message.n, clock=self.clock.origin + self.clock()))
        elif isinstance(message, ww.Begin):
            self.clock.origin = message.origin
            self.arrivals = message.arrivals
            self.begun.set()
        elif isinstance(message, ww.GateState):
            self.gate.update(message)
        elif isinstance(message, ww.Stop):
            self.stop()
        elif isinstance(message, TraceMessage):
            self._trace_message(message)

    def _trace_sessions(self) -> WorkerTrace:
        """--trace: the sessions the coordinator will hand this worker, made as the one driver makes them."""
        opts = self.cfg.turn_options(self.start.plan.model, self.start.plan.salt)
        return WorkerTrace(
            self.cfg,
            opts,
            self.emit,
            self.send,
            self.clock,
            lambda sid: _SessionGate(self.gate, sid),
            self._client_for,
            lambda: self._tls,  # set as it runs, before Begin
            self.tasks,
            self.runners,
        )

    def _trace_message(self, message: TraceMessage) -> None:
        """--trace: the coordinator starts, feeds and ends this worker's sessions; none once it is stopped."""
        if self.trace is not None and not self._stopped:
            self.trace.take(message)

    def stop(self) -> None:
        """Cancel the turns in flight (each ends recorded as cancelled); before Begin, start none."""
        self._stopped = True
        self.begun.set()
        if self._arriving is not None:
            self._arriving.cancel()  # an open loop starts no more conversations
        for t in self.tasks:
            t.cancel()

    def _client_for(self) -> httpx.AsyncClient:
        client = session_client(self.cfg, self._tls)  # closed when its sessions are done
        self._clients.append(client)
        return client

    async def run(self) -> None:
        cfg, start = self.cfg, self.start
        self._tls = tls_context(cfg.ca_bundle, cfg.insecure)
        maker = SessionMaker(
            cfg, start.plan, load_corpus(cfg.corpus), self.emit, self.clock, self._tls, self._client_for
        )
        self.send(ww.Hello(worker=self.worker, pid=os.getpid(), node=self.node, schema=ev.SCHEMA))
        await self.begun.wait()
        failed = False
        if not self._stopped:
            with set_up_heap_frozen():
                failed = await self._drive(maker)
        for client in self._clients:
            await client.aclose()
        self.send(ww.WorkerDone(failed=failed))

    async def _drive(self, maker: SessionMaker) -> bool:
        cfg, arrivals = self.cfg, self.arrivals
        lag = LoopLagMonitor(self.emit, self.clock, worker=self.worker)
        background = [asyncio.create_task(lag.run()), asyncio.create_task(keep_survivors_frozen())]
        background.append(asyncio.create_task(self._say_through()))
        try:
            for resume in self.start.resume:  # a replacement's sessions go on at once, each from its next turn
                self.tasks.append(asyncio.create_task(self._resumed(maker, resume).run()))
            if self.trace is not None:  # its sessions start as the coordinator hands them out, until TraceOver
                self._arriving = asyncio.ensure_future(self.trace.over.wait())
                await asyncio.wait([self._arriving])
            elif arrivals is not None:
                # --max-live over N workers: each keeps its share live (a cap per worker, not one run-wide).
                share = -(-cfg.max_live // self.start.workers) if cfg.max_live else None

                def arriving(k: int, at: float) -> ArrivingSession:
                    r = self._session(maker, k)
                    r.arrival = at
                    return ArrivingSession(r, r.gate, self.emit)

                pairs = [(k, arrivals[k - 1]) for k in self.start.sessions]
                until = self.start.time_limit_at
                self._arriving = asyncio.ensure_future(
                    run_arrivals(pairs, self.clock, until, share, arriving, self.tasks)
                )
                await asyncio.wait([self._arriving])
            else:
                for k in self.start.sessions:
                    r = self._session(maker, k)
                    self.emit(r.plan_event())
                    self.tasks.append(asyncio.create_task(_staggered(r, (k - 1) * cfg.stagger)))
            await wait_all(self.tasks)
        except asyncio.CancelledError:
            pass
        finally:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            lag.flush(self.clock())
        return any(r.failed for r in self.runners)

    async def _say_through(self) -> None:
        """The time up to which this worker has sent its events, every THROUGH_EVERY_S, after them in the pipe."""
        while True:
            self.write_line(ww.encode(ww.Through(t=self.clock())))
            await asyncio.sleep(THROUGH_EVERY_S)

    def _session(self, maker: SessionMaker, k: int, kept: int = 0) -> SessionRunner:
        """Session k, made as every worker makes it, at the run-wide barrier under its own name; with
        --workers-restart it sends what each turn adds to its history (`kept`: messages already sent)."""
        gate = _SessionGate(self.gate, f"s{k}", self.cfg.workers_restart, kept)
        r = gate.runner = maker.session(k, gate)
        self.runners.append(r)
        return r

    def _resumed(self, maker: SessionMaker, resume: ww.SessionResume) -> SessionRunner:
        """A lost worker's session, put where that worker left it."""
        history = [m.encode() for m in resume.history]
        r = self._session(maker, resume.session, kept=len(history))
        r.resume(resume.turn, history, resume.state, resume.kept_turn)
        return r


async def _staggered(runner: SessionRunner, delay: float) -> bool:
    if delay > 0:
        await asyncio.sleep(delay)
    return await runner.run()


async def serve(start: ww.WorkerStart, out_fd: int, pending: bytes) -> int:
    loop = asyncio.get_running_loop()
    writer = await pipe.PipeWriter.open(out_fd, heartbeat=False)
    driver = ShardDriver(start, writer.write_line, writer.flush)

    def command(line: bytes) -> None:
        try:
            driver.command(ww.decode_to_worker(line))
        except Exception:  # noqa: BLE001 - a garbled command is ignored, never fatal
            return

    lifetime.handle_stop_signals(loop, lambda sig: driver.stop())
    await pipe.listen(loop, command, on_eof=driver.stop, pending=pending)  # EOF: the coordinator is gone
    await driver.run()
    await writer.close()
    return 0


def main() -> int:
    return pipe.child_main("worker", ww.decode_to_worker, ww.WorkerStart, "WorkerStart", serve)


if __name__ == "__main__":
    sys.exit(main())
