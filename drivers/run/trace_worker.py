"""A worker's share of a trace (--trace with --workers N or --cluster): the coordinator reads the trace and starts
each of this worker's sessions (TraceSession), hands it its requests just before they are due (TraceTurn) and
ends it (TraceEnd); this makes the session's runner as the one driver would (trace_run.trace_runner) and runs it.
TraceResume: a lost worker's session goes on here (--workers-restart). TraceOver: no more sessions will start here."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Protocol

import httpx

from rampwatch.drivers.client.session import Gate
from rampwatch.drivers.client.streamer import TurnOptions
from rampwatch.drivers.client.trace_prompt import TracePrompts
from rampwatch.drivers.client.trace_session import TraceSessionRunner
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.trace_run import LocalSessions, trace_runner


class SessionGate(Gate, Protocol):
    """A session's view of the run-wide gate that names it as it joins (worker.py's _SessionGate)."""

    def join(self) -> None: ...


TraceMessage = ww.TraceStart | ww.TraceSession | ww.TraceResume | ww.TraceTurn | ww.TraceEnd | ww.TraceOver


class WorkerTrace:
    """This worker's trace sessions; `over` is set once TraceOver says none will start any more."""

    def __init__(
        self,
        cfg: RunConfig,
        opts: TurnOptions,
        emit: Callable[[ev.AnyEvent], None],
        send: Callable[[object], None],
        clock: Callable[[], float],
        gate_for: Callable[[str], SessionGate],
        client_for: Callable[[], httpx.AsyncClient],
        tls: Callable[[], ssl.SSLContext],
        tasks: list[asyncio.Task[bool]],
        runners: list,
    ):
        """`send`: a control message to the coordinator; `gate_for(session)`: the session's gate (it joins the
        run-wide one as it starts); `tls()`: the worker's TLS context, known once it runs; each runner is added to
        `runners` and its task to `tasks`."""
        self.cfg, self.opts, self.clock, self.gate_for, self.client_for = cfg, opts, clock, gate_for, client_for
        self.emit, self.send, self.tls, self.runners = emit, send, tls, runners
        self.sessions = LocalSessions(self._make, emit, tasks)
        self.prompts: TracePrompts | None = None
        self.over = asyncio.Event()

    def take(self, message: TraceMessage) -> None:
        if isinstance(message, ww.TraceStart):
            m = message
            self.prompts = TracePrompts(m.atoms, m.salt, m.block_size, m.template, m.chat)
        elif isinstance(message, ww.TraceSession):
            if self.prompts is not None:  # always, in order: TraceStart comes first
                self.sessions.start(message.k, message.first, message.origin, message.schedule)
        elif isinstance(message, ww.TraceResume):
            if self.prompts is not None:
                m = message
                self.sessions.resume(m.k, m.session, m.origin, m.previous, m.said)
        elif isinstance(message, ww.TraceTurn):
            if message.request.session in self.sessions.live:
                self.sessions.turn(message.request)
        elif isinstance(message, ww.TraceEnd):
            self.sessions.end(message.session)
        elif isinstance(message, ww.TraceOver):
            self.over.set()

    def _make(self, sid: str, k: int, origin: float) -> TraceSessionRunner:
        assert self.prompts is not None
        gate = self.gate_for(sid)
        gate.join()  # the coordinator counts it live, and names it if this worker is lost
        client, tls = self.client_for(), self.tls()
        runner = trace_runner(
            self.cfg, self.prompts, self.opts, sid, k, origin, client, self.emit, self.clock, gate, tls
        )
        if self.cfg.workers_restart:  # a text trace's conversation is kept by the coordinator, to go on elsewhere
            runner.keep_said = lambda said: self.send(ww.TraceSaid(session=sid, said=said))
        self.runners.append(runner)
        return runner
