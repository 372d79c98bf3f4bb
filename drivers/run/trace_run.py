"""--trace in a run: the trace read once before anything is sent (checked, so a bad row is bad input, and each
session's turns counted), the server's atoms and chat template measured for the prompts, then its requests read
again and handed to their sessions just before they are due, so memory holds the sessions live, not the file.
The sessions run here (LocalSessions), on workers (trace_spread.py), or, with --shard, here only those of the
shard: every process numbers them alike, by first appearance."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx

from rampwatch.drivers.client.prompts import Corpus
from rampwatch.drivers.client.session import Gate
from rampwatch.drivers.client.streamer import TurnOptions
from rampwatch.drivers.client.tokenizer import ServerTokenizer, over_httpx
from rampwatch.drivers.client.trace_prompt import (
    CANDIDATES,
    TracePrompts,
    corpus_candidates,
    find_atoms,
    measure_template,
)
from rampwatch.drivers.client.trace_session import TraceSessionRunner
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.trace import TraceRequest
from rampwatch.drivers.model.trace_slice import TraceSlice
from rampwatch.drivers.run.config import BadInput, RunConfig, TraceOptions
from rampwatch.drivers.run.shards import worker_of
from rampwatch.drivers.run.trace_read import TraceReading, open_trace

LEAD_S = 1.0  # the trace's due 0 is this long after the replay starts: its first sessions are made by then
AHEAD_S = 0.5  # a request is handed to its session this long before it is due
WARM_SALT_BYTES = 1 << 20  # --trace-warm: the salt is a digest of the trace's size and first MiB


def warm_salt(path: str) -> str:
    """The trace's own salt (--trace-warm): the same file gives the same prompts in every run."""
    with open(path, "rb") as f:
        head = f.read(WARM_SALT_BYTES)
    digest = hashlib.blake2b(head, digest_size=6, person=b"rampwatch-warm")
    digest.update(str(Path(path).stat().st_size).encode())
    return "warm-" + digest.hexdigest()


class TraceReplay:
    """One run's trace: read, checked and counted by `prepare`, replayed by `dispatch`."""

    def __init__(self, opts: TraceOptions):
        self.opts = opts
        self.cut = TraceSlice.of(opts)
        self.reading: TraceReading = open_trace(opts.path, opts.format, opts.block_size, opts.skip_bad)
        self.schedules: dict[str, list[int]] = {}  # each session's prompt sizes, in turn order
        self.starts: list[float] = []  # each session's first due time in the trace, in order
        self.prompts: TracePrompts | None = None

    def read(self, max_model_len: int | None) -> None:
        """Read the whole trace once: BadInput for a bad row (without --trace-skip-bad), for a trace with no
        request left, or for a request longer than the server takes."""
        schedules: dict[str, list[int]] = {}
        longest = 0  # prompt and output: what the server must hold for the request
        for r in self.reading.requests(self.cut, self.opts.kv_tokens):
            if r.session not in schedules:
                self.starts.append(r.due_s)
            schedules.setdefault(r.session, []).append(r.input_length)
            longest = max(longest, r.input_length + max(1, r.output_length))
        if not schedules:
            raise BadInput(f"{self.opts.path}: no request left to send (skipped: {self.reading.skipped or 'none'})")
        if max_model_len and longest > max_model_len:
            raise BadInput(
                f"{self.opts.path}: a request of {longest:,} tokens with its output, over the server's "
                f"max_model_len {max_model_len:,}; pass --trace-max-context {max_model_len * 9 // 10} to leave such "
                "requests out"
            )
        self.schedules = schedules

    async def measure(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        model: str,
        salt: str,
        corpus: Corpus | None = None,
    ) -> None:
        """What the prompts are made of on this server: its one-token atoms (from --corpus's words when given)
        and its chat template's tokens; their salt the run's, or with --trace-warm the trace's own."""
        if self.opts.warm:
            salt = warm_salt(self.opts.path)
        tokenizer = ServerTokenizer(over_httpx(client, base_url, headers), model)
        atoms = await find_atoms(tokenizer, salt, corpus_candidates(corpus.text) if corpus else CANDIDATES)
        chat = self.opts.api == "chat"
        template = await measure_template(tokenizer, atoms, chat)
        self.prompts = TracePrompts(atoms, salt, self.reading.block_size, template, chat)

    def header(self) -> ev.TraceRun:
        o = self.opts
        return ev.TraceRun(
            path=o.path,
            format=self.reading.format,
            block_size=self.reading.block_size,
            kv_tokens=o.kv_tokens,
            start_s=o.start_s,
            duration_s=o.duration_s,
            sessions=o.sessions,
            max_context=o.max_context,
            skipped=dict(self.reading.skipped),
            api=o.api,
            exact=self.prompts.atoms.exact if self.prompts is not None else False,
            timing=o.timing,
            speed=o.speed,
            warm=o.warm,
            sessions_per_s=self.sessions_per_s(),
        )

    def sessions_per_s(self) -> float | None:
        """Sessions starting a second at --trace-speed, over the slice from its first start to its last (None
        for a slice with one start)."""
        if len(self.starts) < 2 or self.starts[-1] <= self.starts[0]:
            return None
        return (len(self.starts) - 1) / (self.starts[-1] - self.starts[0]) * self.opts.speed

    async def dispatch(
        self,
        sessions: TraceSessions,
        clock: Callable[[], float],
        time_scale: float,
        until: float | None = None,
        own: Callable[[int], bool] = lambda k: True,
    ) -> None:
        """Every request to its session just before it is due: sessions are numbered k = 1, 2, ... by first
        appearance, and `sessions` starts each at its first request, then takes its requests and its end; only the
        sessions `own(k)` says are this process's are handed on (--shard); nothing past `until` (the time limit).
        Returns once the last request has been handed on."""
        origin = clock() + LEAD_S
        left = {sid: len(sizes) for sid, sizes in self.schedules.items()}
        number: dict[str, int] = {}  # each session's k, counted over the whole trace (every shard counts alike)
        live: set[str] = set()
        try:
            for r in self.reading.requests(self.cut, self.opts.kv_tokens):
                due = origin + r.due_s / (time_scale * self.opts.speed)
                if until is not None and due >= until:
                    break
                first = r.session not in number
                k = number.setdefault(r.session, len(number) + 1)
                if not own(k):
                    continue
                await asyncio.sleep(max(0.0, due - AHEAD_S - clock()))
                if first:
                    live.add(r.session)
                    sessions.start(k, r, origin, self.schedules.get(r.session, []))
                sessions.turn(r)
                left[r.session] -= 1
                if left[r.session] == 0:
                    live.discard(r.session)
                    sessions.end(r.session)
        finally:
            for sid in live:  # cut off by the time limit, or the dispatch stopped
                sessions.end(sid)

    async def run_here(
        self,
        make: Callable[[str, int, float], TraceSessionRunner],
        emit: Callable[[ev.AnyEvent], None],
        tasks: list[asyncio.Task[bool]],
        clock: Callable[[], float],
        time_scale: float,
        until: float | None,
        shard: tuple[int, int] | None,
    ) -> None:
        """The sessions run in this process, each made by `make(session, k, origin)` as it starts; with --shard
        I/N only shard I's (the trace's k-th session by first appearance is shard (k-1) mod N's)."""
        i, n = shard or (0, 1)  # one process: all the sessions, shard 0 of 1
        own = lambda k: worker_of(k, n) == i  # noqa: E731
        await self.dispatch(LocalSessions(make, emit, tasks), clock, time_scale, until=until, own=own)


class TraceSessions(Protocol):
    """Where `dispatch` hands a trace's sessions: runners in this process (LocalSessions), or the workers'
    (trace_spread.py)."""

    def start(self, k: int, first: TraceRequest, origin: float, schedule: list[int]) -> None:
        """Session `first.session`, the trace's k-th, starts (`origin`: the trace's due 0 on the run's clock)."""

    def turn(self, request: TraceRequest) -> None: ...

    def end(self, session: str) -> None: ...


class LocalSessions:
    """A trace's sessions run here: each made (`make(session, k, origin)`), announced and run as a task of
    `tasks` at its first request, its requests queued to it, None once it has no more."""

    def __init__(
        self,
        make: Callable[[str, int, float], TraceSessionRunner],
        emit: Callable[[ev.AnyEvent], None],
        tasks: list[asyncio.Task[bool]],
    ):
        self.make, self.emit, self.tasks = make, emit, tasks
        self.live: dict[str, TraceSessionRunner] = {}

    def start(self, k: int, first: TraceRequest, origin: float, schedule: list[int]) -> None:
        runner = self.live[first.session] = self.make(first.session, k, origin)
        planned = runner.plan_event(first)
        planned.schedule = schedule
        self.emit(planned)
        self.tasks.append(asyncio.create_task(runner.run()))

    def resume(
        self, k: int, sid: str, origin: float, previous: tuple[float, float] | None, said: list[tuple[str, str]]
    ) -> None:
        """A lost worker's session, going on here (--workers-restart): planned already, it is not announced again;
        `previous` and `said` are where that worker left its timing and its conversation."""
        runner = self.live[sid] = self.make(sid, k, origin)
        runner.previous, runner.said, runner.kept = previous, list(said), len(said)
        self.tasks.append(asyncio.create_task(runner.run()))

    def turn(self, request: TraceRequest) -> None:
        self.live[request.session].turns.put_nowait(request)

    def end(self, session: str) -> None:
        runner = self.live.pop(session, None)
        if runner is not None:
            runner.turns.put_nowait(None)


def trace_runner(
    cfg: RunConfig,
    prompts: TracePrompts,
    opts: TurnOptions,
    sid: str,
    k: int,
    origin: float,
    client: httpx.AsyncClient,
    emit: Callable[[ev.AnyEvent], None],
    clock: Callable[[], float],
    gate: Gate,
    tls: ssl.SSLContext,
) -> TraceSessionRunner:
    """The trace's k-th session, made alike in the one driver, a worker or a shard: to its --pin or its
    round-robin server by k, timed by --trace-speed and --trace-timing."""
    trace = cfg.trace
    assert trace is not None
    return TraceSessionRunner(
        sid,
        prompts,
        client,
        cfg.target_for(sid, k),
        cfg.headers(),
        opts,
        emit,
        clock,
        origin,
        speed=trace.speed,
        chained=trace.timing == "session",
        gate=gate,
        tls=tls,
    )
