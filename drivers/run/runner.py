"""A whole run: probe the server, plan the ramps, drive the sessions and the samplers, and close the
recording, whatever happens. What it reads beside the sessions is samplers.py; how it keeps the heap out
of the stamping loop's way is memory.py; how its sessions are waited for and stopped is stopping.py."""

from __future__ import annotations

import asyncio
import secrets
import sys
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from rampwatch.drivers.client.prompts import Corpus, Lead
from rampwatch.drivers.client.ramp import Calibration, Conversation
from rampwatch.drivers.client.session import SessionRunner
from rampwatch.drivers.client.streamer import TurnOptions
from rampwatch.drivers.client.trace_session import TraceSessionRunner
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.net.tls import TlsError, tls_context
from rampwatch.drivers.run.arrivals import ArrivingSession, arrival_times, run_arrivals
from rampwatch.drivers.run.config import BadInput, RunConfig, check_direct, check_topology, default_record_path
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED, crash_summary
from rampwatch.drivers.run.hub import EventHub
from rampwatch.drivers.run.loop_lag import LoopLagMonitor
from rampwatch.drivers.run.memory import keep_survivors_frozen, return_big_buffers_to_the_os, set_up_heap_frozen
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.probe import CALIBRATION_CHARS, ServerInfo, calibrate, probe, probe_servers
from rampwatch.drivers.run.prompt_shape import corpus_reader, load_corpus, prompt_shape, shared_lead
from rampwatch.drivers.run.recording import Recorder
from rampwatch.drivers.run.run_header import run_header
from rampwatch.drivers.run.samplers import Samplers
from rampwatch.drivers.run.session_maker import SessionMaker, conversation, session_client
from rampwatch.drivers.run.shards import check_workers, seeded_salt, sessions_of
from rampwatch.drivers.run.spread import Spread, at_most_a_worker_a_session, on_workers
from rampwatch.drivers.run.stopping import stop_early, time_limit, wait_all
from rampwatch.drivers.run.trace_run import TraceReplay, trace_runner
from rampwatch.drivers.run.trace_spread import replay_on_workers
from rampwatch.drivers.run.worker_wire import SessionPlan
from rampwatch.drivers.telemetry.client_metrics import parse_listen
from rampwatch.drivers.telemetry.otlp import OtlpReceiver
from rampwatch.drivers.telemetry.prometheus import check_prometheus

FINISHED: tuple[ev.RunStatus, ...] = ("done", "failed", "time-limit", "saturated")  # ran to an end of its own


class Run:
    """Owns one run's hub, clock and tasks. `prepare` validates (BadInput),
    `drive` runs to the end or until cancelled, always closing the recording.

    `fold`: keep a RunState of the run in this process (headless output, the
    final report, tests); the driver process behind the UI does not need one."""

    FINAL_WAIT_S = 60.0  # how long a finished run waits for a full disk to take its last events

    def __init__(self, cfg: RunConfig, record: bool = True, keep_events: bool = False, fold: bool = True):
        return_big_buffers_to_the_os()
        self.cfg = cfg
        self.record = record
        self.clock = RunClock()
        self.started_at = datetime.now(UTC).isoformat(timespec="milliseconds")  # wall time of t = 0
        self.state = RunState() if fold else None
        self.hub = EventHub(self.state, keep_events=keep_events)
        self.info: ServerInfo | None = None
        self.salt = secrets.token_hex(6)
        self.calibration = Calibration()
        self.corpus: Corpus | None = None  # --corpus, read once prepare() starts
        self.lead = Lead()  # what every session opens with (--system-prompt, --shared-prefix)
        self.exit_code = 0
        self.interrupted_by: int | None = None
        self._interrupted = False
        self._ending = False  # drive() is writing the run's end: a stop now cuts its waits short, never the writing
        self._cut_short = asyncio.Event()
        self._clients: list[httpx.AsyncClient] = []
        self.tls = tls_context()
        self.otlp: OtlpReceiver | None = None  # --otlp: the engine's trace spans
        # Open loop: the seed that draws the arrival times, recorded so the run can be repeated.
        self.seed = cfg.seed if cfg.seed is not None else secrets.randbelow(1 << 31)
        # A sweep's point ends early when this says why (the server saturated); asked once a second.
        self.stop_when: Callable[[RunState], str | None] | None = None
        self.stopped_early: str | None = None
        self.trace: TraceReplay | None = None  # --trace: the sessions come from it
        self.limit_at = cfg.time_limit  # --time-limit on the run's clock (from --start-at's time, if given)
        self.spread = Spread(self.hub, self.clock)  # where the sessions run: here, or on workers (--workers, --cluster)

    def _client_for(self) -> httpx.AsyncClient:
        client = session_client(self.cfg, self.tls)  # closed with the run
        self._clients.append(client)
        return client

    async def _close_clients(self) -> None:
        clients, self._clients = self._clients, []
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    async def prepare(self) -> None:
        cfg = self.cfg
        check_topology(cfg)
        check_direct(cfg)
        check_workers(cfg)
        self.cfg = cfg = self.spread.connect(cfg)
        if cfg.seed is not None:
            self.salt = seeded_salt(cfg.seed, cfg.salt_tag)  # the same prompts for the same seed, however run
        try:
            self.tls = tls_context(cfg.ca_bundle, cfg.insecure)
        except TlsError as e:
            raise BadInput(str(e)) from None
        client = self._client_for()
        if cfg.prometheus:
            problem = await check_prometheus(client, cfg.prometheus, cfg.prometheus_engines(), cfg.prometheus_gpus())
            if problem:
                raise BadInput(problem)
        if cfg.mode == "watch":
            info = ServerInfo(model=cfg.model or "", max_model_len=None, engine=None, engine_version=None)
            try:
                info = await probe(client, cfg)
            except BadInput:
                pass  # watching needs only /metrics; a server without /v1/models is fine
        elif cfg.trace is not None:
            self.trace = replay = TraceReplay(cfg.trace)
            info = await probe_servers(client, cfg, check=False)
            replay.read(info.max_model_len)
            self.corpus = corpus = load_corpus(cfg.corpus)
            await replay.measure(client, cfg.base_url, cfg.headers(), info.model, self.salt, corpus)
        else:
            info = await probe_servers(client, cfg)
            self.corpus = corpus = load_corpus(cfg.corpus)
            sample = corpus.sample(CALIBRATION_CHARS) if corpus else None
            self.calibration = await calibrate(client, cfg, info.model, self.conversation(1), sample)
            self.lead = await shared_lead(client, cfg, info.model, self.calibration, corpus, self.salt)
        self.info = info
        sessions = len(self.trace.schedules) if self.trace is not None else self.ramp_sessions
        self.cfg = cfg = at_most_a_worker_a_session(cfg, sessions)
        self.spread.trim(cfg)  # the processes spawned for workers no session needs end now
        if cfg.otlp:
            await self._listen_for_spans(cfg.otlp)
        header = self.header()
        if self.record:
            path = cfg.record or default_record_path(info.model or "watch")
            if cfg.record is None:
                path.parent.mkdir(parents=True, exist_ok=True)
            problem = Recorder.check_path(path)
            if problem:
                raise BadInput(problem + " (or pass --no-record)")
            try:
                self.hub.recorder = Recorder(path, header)
            except OSError as e:
                raise BadInput(f"cannot create recording {path}: {e.strerror or e} (or pass --no-record)") from None
        if self.state is not None:
            self.state.header = header

    def plan(self) -> SessionPlan:
        """What every session is made from, here or on a worker: the run's salt, calibration and lead."""
        model = self.info.model if self.info is not None else self.cfg.model or ""
        return SessionPlan(
            salt=self.salt, model=model, calibration=self.calibration, lead=self.lead, sessions=self.ramp_sessions
        )

    def conversation(self, k: int) -> Conversation:
        """Session k's conversation (1-based): session_maker.conversation, as every worker makes it."""
        return conversation(self.cfg, self.plan(), self.corpus, k)

    def own_sessions(self) -> list[int]:
        """The ramp sessions (1-based) this process runs or has its workers run: all, or its --shard's."""
        if self.cfg.shard is not None:
            return sessions_of(*self.cfg.shard, self.ramp_sessions)
        return list(range(1, self.ramp_sessions + 1))

    def one_shot_conversation(self) -> Conversation:
        """The baseline's: a fresh salt, the run's lead (a new user of the same deployment), the last turn's
        size; with --corpus, a place in it of its own."""
        salt = f"{self.salt}-one-shot-{secrets.token_hex(4)}"
        source = corpus_reader(self.corpus, salt, 0, 1)
        return Conversation(salt, self.cfg.schedule[-1:], self.calibration, self.lead, source)

    def header(self) -> ev.Header:
        return run_header(
            self.cfg,
            self.info,
            salt=self.salt,
            seed=self.seed,
            started_at=self.started_at,
            sessions=len(self.trace.schedules) if self.trace is not None else self.ramp_sessions,
            prompts=prompt_shape(self.cfg, self.lead, self.corpus),
            trace=self.trace.header() if self.trace is not None else None,
        )

    def interrupt(self, task: asyncio.Task, sig: int | None) -> None:
        """End the run as interrupted by `sig` (None: the UI went away) by cancelling `task`, the one awaiting
        drive(). Only the first call counts, and none once drive() is writing the run's end (waiting for the
        last spans, the last metrics read): a stop then only cuts those waits short. A second Ctrl-C, the closed
        pipe that follows a dead UI's SIGTERM, or a quit during the end would otherwise cancel the clean-up and
        lose the recording's RunEnded."""
        if self._ending:
            self._cut_short.set()
            return
        if self._interrupted or task.done():
            return
        self._interrupted = True
        self.interrupted_by = sig
        task.cancel()

    @property
    def ramp_sessions(self) -> int:
        """Sessions that ramp: none when --one-shot comes with a one-turn schedule (the baseline alone)."""
        if self.trace is not None:  # a trace's sessions are its own (header: trace.schedules)
            return 0
        return 0 if self.cfg.one_shot and len(self.cfg.schedule) == 1 else self.cfg.sessions

    @property
    def recording_path(self) -> Path | None:
        return self.hub.recorder.path if self.hub.recorder else None

    async def drive(self) -> int:
        """Run to the end. Returns the exit code: 0 ok, 1 failed turns,
        129/130/143 interrupted, 3 crashed (an unexpected exception, recorded as
        RunEnded(crashed) with its one-line summary)."""
        with set_up_heap_frozen():
            return await self._drive()

    async def _drive(self) -> int:
        cfg, emit, clock = self.cfg, self.hub.emit, self.clock
        samplers = Samplers(cfg, emit, clock, self.tls)
        background: list[asyncio.Task] = list(samplers.start())
        if cfg.insecure:
            emit(ev.Notice(t=clock(), level="warn", message="TLS certificates are NOT verified (--insecure)"))
        background.append(asyncio.create_task(self._flush_loop()))
        background.append(asyncio.create_task(keep_survivors_frozen()))
        lag = LoopLagMonitor(emit, clock)
        if cfg.mode != "watch" and not on_workers(cfg):  # with workers, each checks its own loop
            background.append(asyncio.create_task(lag.run()))
        runners: list[SessionRunner] = []
        status: ev.RunStatus = "done"
        error: str | None = None
        try:
            if cfg.mode == "watch":
                await asyncio.Event().wait()  # until interrupted
            await samplers.first_reads()
            assert self.info is not None
            opts = cfg.turn_options(self.info.model, self.salt)
            open_loop = cfg.arrivals_per_s is not None or self.trace is not None
            own = self.own_sessions()
            gate = TurnGate(0 if open_loop else len(own), lockstep=cfg.lockstep)
            self.limit_at = await self.spread.start_at(cfg) or self.limit_at
            maker = SessionMaker(cfg, self.plan(), self.corpus, emit, clock, self.tls, self._client_for)

            def session(k: int) -> SessionRunner:
                r = maker.session(k, gate)
                runners.append(r)
                return r

            pool = (
                self.spread.pool(cfg, self.plan(), gate, self.arrival_times, self.limit_at, self.trace)
                if on_workers(cfg)
                else None
            )
            if pool is not None:
                background.append(asyncio.create_task(self.spread.release_loop()))
                runners.append(pool)  # type: ignore[arg-type]  # its `failed` says whether any session failed
                open_loop = False  # the workers run the arrivals themselves
                if self.trace is not None:  # ... but only this process reads the trace: it hands out the requests
                    open_loop = True
                    trace, scale, until = self.trace, opts.time_scale, self.limit_at
                    arrivals = lambda: replay_on_workers(trace, pool, tasks[0], clock, scale, until)  # noqa: E731
            elif self.trace is not None:
                arrivals: Callable[[], Awaitable[None]] = lambda: self._replay(opts, gate, runners, tasks)  # noqa: E731
            elif open_loop:
                arrivals = lambda: self._arrivals(session, gate, tasks, own)  # noqa: E731
            else:
                for k in own:
                    emit(session(k).plan_event())
            baseline = None
            if cfg.one_shot and (cfg.shard is None or cfg.shard[0] == 0):  # a sharded run's one baseline: shard 0's
                baseline = SessionRunner(
                    "one-shot",
                    self.one_shot_conversation(),
                    self._client_for(),
                    cfg.target_for("one-shot", 1),
                    cfg.headers(),
                    opts,
                    emit,
                    clock,
                    gate=gate,
                    role="one-shot",
                    tls=self.tls,
                )
                emit(baseline.plan_event())
            slots = asyncio.Semaphore(cfg.concurrency or len(runners) or 1)
            if pool is not None:
                tasks = [asyncio.create_task(pool.run())]
            else:
                starts = [(k - 1) * cfg.stagger for k in own] if not open_loop else []
                tasks = [asyncio.create_task(self._staggered(r, d, slots)) for r, d in zip(runners, starts)]
            watchdog = None
            if self.limit_at is not None:
                watchdog = asyncio.create_task(time_limit(self.limit_at, cfg.grace, self.clock, emit, gate, tasks))
            arriving = asyncio.create_task(arrivals()) if open_loop else None
            early = None
            if self.stop_when is not None:
                assert self.state is not None
                stopped = self._stopped_early
                until = stop_early(self.stop_when, self.state, self.clock, emit, gate, tasks, arriving, stopped)
                early = asyncio.create_task(until)
            try:
                if arriving is not None:
                    await asyncio.wait([arriving])  # cancelled by an early stop: the run goes on to its end
                    if not arriving.cancelled() and arriving.exception() is not None:
                        raise arriving.exception()  # type: ignore[misc]
                await wait_all(tasks)
                if baseline is not None:
                    # After the ramp, alone on the server, unless the time limit already stopped new turns.
                    gate.join()
                    runners.append(baseline)
                    if pool is not None:  # the workers are done: the baseline is stamped here, on this loop
                        background.append(asyncio.create_task(lag.run()))
                    await wait_all([asyncio.create_task(baseline.run())])
            finally:
                for t in (watchdog, arriving, early):
                    if t is not None:
                        t.cancel()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            self.exit_code = 1 if any(r.failed for r in runners) else 0
            status = (
                "saturated"
                if self.stopped_early
                else "time-limit"
                if gate.time_up
                else "failed"
                if self.exit_code
                else "done"
            )
        except asyncio.CancelledError:
            status = "interrupted"
            self.exit_code = 128 + self.interrupted_by if self.interrupted_by else 130  # 143 SIGTERM, 129 SIGHUP
        except Exception as e:  # noqa: BLE001 - a bug must end the run loudly, recorded, never as "done"
            status, error, self.exit_code = "crashed", crash_summary(e), EXIT_CRASHED
            traceback.print_exc()  # the driver's stderr: the details behind the one-line summary
        finally:
            self._ending = True
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            lag.flush(clock())  # the last second's lag: the last turns' stamps are judged too
            self.hub.release()  # what the workers' events still held (in time order), before the run's end
            if self.otlp is not None:
                await self.otlp.finish(wait=status in FINISHED, cut_short=self._cut_short)
            if status in FINISHED:
                await samplers.final_read()
            await samplers.aclose()
            self.hub.flush(force=True)  # a disk that filled up gets one more try, and says so
            emit(ev.RunEnded(t=clock(), status=status, exit_code=self.exit_code, error=error))
            if self.hub.recorder is not None:
                await self.hub.recorder.drain(self.FINAL_WAIT_S)
            self.close()
            await self._close_clients()
            await self.spread.aclose()
        return self.exit_code

    async def _listen_for_spans(self, listen: str) -> None:
        """--otlp: the receiver on this loop; it follows the run's events to know which spans are its turns'."""
        host, port = parse_listen(listen)
        self.otlp = OtlpReceiver(self.hub.emit, self.clock)
        try:
            await self.otlp.start(host, port)
        except OSError as e:
            self.otlp = None
            raise BadInput(f"--otlp {listen}: cannot listen: {e.strerror or e}") from None
        where = f"http://{host}:{self.otlp.port}/v1/traces"
        print(f"rampwatch: receiving OTLP spans on {where}", file=sys.stderr, flush=True)
        self.hub.listeners.append(self.otlp.follow)

    async def _arrivals(
        self, session: Callable[[int], SessionRunner], gate: TurnGate, tasks: list, own: list[int]
    ) -> None:
        """Open loop: a new conversation at each seeded Poisson arrival, up to --sessions, none after the time
        limit; each is planned when it arrives and runs once a --max-live slot is free."""
        cfg, clock = self.cfg, self.clock
        assert cfg.arrivals_per_s is not None

        def start(k: int, at: float) -> ArrivingSession:
            r = session(k)
            r.arrival = at
            return ArrivingSession(r, gate, self.hub.emit)

        times = self.arrival_times()
        assert times is not None
        await run_arrivals([(k, times[k - 1]) for k in own], clock, self.limit_at, cfg.max_live, start, tasks)

    def arrival_times(self) -> list[float] | None:
        """Open loop: each session's arrival on the run's clock, drawn from the seed and counted from now (not
        from the clock's zero: arrivals drawn inside the probe and calibration would otherwise all start at once,
        each turn 1 late by the setup); None for a closed loop."""
        if self.cfg.arrivals_per_s is None:
            return None
        begun = self.clock()
        return [begun + t for t in arrival_times(self.cfg.arrivals_per_s, self.ramp_sessions, self.seed)]

    async def _replay(self, opts: TurnOptions, gate: TurnGate, runners: list, tasks: list) -> None:
        """--trace here: its sessions made as they start, each on the server it is pinned or spread to."""
        assert self.trace is not None and self.trace.prompts is not None
        cfg, prompts = self.cfg, self.trace.prompts

        def make(sid: str, k: int, origin: float) -> TraceSessionRunner:
            gate.join()
            client = self._client_for()
            runner = trace_runner(cfg, prompts, opts, sid, k, origin, client, self.hub.emit, self.clock, gate, self.tls)
            runners.append(runner)
            return runner

        await self.trace.run_here(make, self.hub.emit, tasks, self.clock, opts.time_scale, self.limit_at, cfg.shard)

    def _stopped_early(self, reason: str) -> None:
        self.stopped_early = reason

    async def _staggered(self, runner: SessionRunner, delay: float, slots: asyncio.Semaphore) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        async with slots:
            await runner.run()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(Recorder.FLUSH_EVERY)
            self.hub.flush()

    def close(self) -> None:
        rec = self.hub.recorder
        if rec is not None:
            rec.close()

    async def aclose(self) -> None:
        """Release what prepare() opened when the run never starts."""
        self.close()
        if self.otlp is not None:
            await self.otlp.aclose()
        await self._close_clients()
        await self.spread.aclose()

    def mark(self, note: str) -> None:
        self.hub.emit(ev.Mark(t=self.clock(), note=note))
