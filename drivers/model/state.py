"""RunState: folds events into the live picture of a run. Pure: no I/O, no Textual.

`apply` is O(1) per event (O(tokens) for a batch of token times, O(sessions) per batch for the interference
split), so the driver can call it inline. Each finished turn is settled once its figures are final (at its end,
or for a prefill/decode split once the decode servers' counters show its transferred KV): then it is marked for
--warmup, judged by --slo, logged and appended to `settled`, the list the exporter reads. What the panels ask of
the folded state lives in panels.py; the deployment's shape in deployment.py; the servers' side of the fold
(endpoints, GPUs) in servers_fold.py. (Over ~400 lines, about 460: one handler per event kind, read together as
the one fold of the sessions' turns; what has a job of its own lives beside it: the servers' fold, the spans',
the transfers' and the backends' ledgers, the client check, the run's log, the prefill index.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.affinity import moves_of
from rampwatch.drivers.model.backends import BackendLedger
from rampwatch.drivers.model.client_check import ClientCheck
from rampwatch.drivers.model.deployment import decode_endpoints, split
from rampwatch.drivers.model.endpoints import EndpointView
from rampwatch.drivers.model.engine_spans import SpanLedger
from rampwatch.drivers.model.gaps import add_gaps
from rampwatch.drivers.model.log import LogEntry, RunLog
from rampwatch.drivers.model.modelled import modelled, time_factor
from rampwatch.drivers.model.prefill_index import PrefillIndex
from rampwatch.drivers.model.servers_fold import ServersFold
from rampwatch.drivers.model.slo import GoodputTally, parse_slo
from rampwatch.drivers.model.split_transfer import TransferLedger, covers, transfer_counters
from rampwatch.drivers.model.ttft_split import wait_parts
from rampwatch.drivers.model.turns import LATE_S, TurnRecord, prefill_tok_s
from rampwatch.drivers.model.views import NO_ANSWER, SessionView
from rampwatch.drivers.model.warmup import SteadyWindow, parse_warmup
from rampwatch.drivers.model.workers import WorkerLedger

T = TypeVar("T")


class RunState:
    """The live picture of a run, folded from its events one at a time.

    The driver (headless), the UI process (live, from the pipe) and replay
    each keep their own; `version` changes with every event applied, so a
    reader can tell when nothing has changed since it last looked."""

    def __init__(self, header: ev.Header | None = None):
        self.client = ClientCheck()  # the driver's own loop: its lag, and the turns stamped while it ran late
        self.header = header
        self.t = 0.0  # time of the newest event (modelled: see time_scale)
        self.raw_t = 0.0  # ... as recorded (wall clock), for events made from it
        self.version = 0  # events applied so far
        self.sessions: dict[str, SessionView] = {}
        self.turns: list[TurnRecord] = []  # every finished attempt, in finishing order
        self.settled: list[TurnRecord] = []  # ... in the order their figures became final (see the module doc)
        self.late_turns = 0  # settled turns past --warmup sent over 10 ms after they were due (TurnRecord.late)
        self._turns_settled = 0  # finished turns changed after their end (a late span, transferred KV attributed)
        self.servers = ServersFold()  # the endpoints' metrics, the merged server view, the GPUs
        servers = self.servers  # the readers' names for its parts, the same objects
        self.server, self.endpoints, self.gpu_fleet = servers.server, servers.endpoints, servers.gpu_fleet
        self.usage_has_cache: bool | None = None  # any finished turn's usage with cached tokens (None: no turn yet)
        self.engine_timed: bool | None = None  # any finished turn the engine timed itself (None: no turn yet)
        self.front_end_timed = False  # any turn whose wait splits off the server's front end (its span's own TTFT)
        self.log = RunLog()
        self.ended: ev.RunEnded | None = None
        self.recording_error: str | None = None
        self._prefilling: dict[str, TurnRecord] = {}
        self.prefills = PrefillIndex()  # which sessions' prefills a token batch can overlap
        self._planned_ramp = 0  # ramp sessions planned so far: the next one's `order`
        self.last_prefill_rate: dict[str, float] = {}  # session ('' = any) -> new tokens/s
        # A split's transferred KV per turn: a finished turn settles once a decode server's sample covers its
        # first token (or the run ends), so its line never calls transferred KV cached.
        self.transfers = TransferLedger()
        self.spans = SpanLedger()  # the engine's trace spans (--otlp), joined to turns by request id
        self.backends = BackendLedger()  # which backend served each turn, from its span or the backends' counters
        self.workers = WorkerLedger()  # the driver workers (--workers N, --cluster, merged shards); empty: one driver

    # -- folding -------------------------------------------------------------

    @property
    def header(self) -> ev.Header | None:
        return self._header

    @header.setter
    def header(self, header: ev.Header | None) -> None:
        self._header = header
        self.client.k = time_factor(header)  # its windows are wall seconds, read in the fold's modelled ones
        self.steady = SteadyWindow(_recorded(parse_warmup, header.warmup if header is not None else None))
        self.goodput = GoodputTally(_recorded(parse_slo, header.slo if header is not None else None))  # judged live

    @property
    def turns_revision(self) -> int:
        """Changes whenever `turns` does: one more, or a finished one settled later (its span, its transferred KV,
        a client-busy mark), so a table of finished turns redraws exactly then."""
        return len(self.turns) + self._turns_settled + self.client.marked + self.client.marked_own

    def turns_by_session(self) -> dict[str, list[TurnRecord]]:
        """The finished turns grouped by session, in order: one pass, for readers that go session by session (a
        trace has thousands)."""
        out: dict[str, list[TurnRecord]] = {}
        for r in self.turns:
            out.setdefault(r.session, []).append(r)
        return out

    @property
    def time_scale(self) -> float:
        """Modelled seconds per recorded second (a sped-up simulated engine; 1 for a real server)."""
        return time_factor(self.header)

    def modelled_time(self, recorded: float) -> float:
        """A recorded (wall clock) run time as the fold's times read: the one conversion, here and in apply."""
        return recorded * self.time_scale

    def apply(self, e: ev.AnyEvent) -> None:
        self.version += 1
        if e.t > self.raw_t:
            self.raw_t = e.t
        k = self.time_scale
        if k != 1.0:
            e = modelled(e, k)
        if e.t > self.t:
            self.t = e.t
        handler = _HANDLERS.get(type(e))
        if handler is not None:
            handler(self, e)

    def _on_planned(self, e: ev.SessionPlanned) -> None:
        self._planned_ramp += e.role == "ramp"
        self.sessions[e.session] = SessionView(
            id=e.session,
            schedule=list(e.schedule),
            role=e.role,
            order=self._planned_ramp if e.role == "ramp" else 0,
            endpoint=e.endpoint,
            arrival=e.arrival,
            worker=e.worker,
        )

    def _on_worker_started(self, e: ev.WorkerStarted) -> None:
        self.workers.started(e)
        if e.replaces is not None:  # its sessions' turns from now on are stamped on its loop
            for sid in e.sessions:
                if sid in self.sessions:  # (one still to arrive is planned there, with its worker)
                    self.sessions[sid].worker = e.worker

    def _session(self, sid: str) -> SessionView:
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = SessionView(id=sid, schedule=[])
        return s

    def _on_sent(self, e: ev.RequestSent) -> None:
        s = self._session(e.session)
        rec = TurnRecord(
            session=e.session,
            turn=e.turn,
            target=e.target_tokens,
            new_tokens_est=e.new_tokens_est,
            sent_t=e.t,
            attempt=e.attempt,
            prev_prompt_tokens=s.last_prompt_tokens,
            prev_reply_tokens=last.answer_tokens if (last := s.last_done) is not None and last.status == "ok" else 0,
            think_s=s.pause.seconds if s.pause is not None and s.pause.turn == e.turn else None,
            cache_at_sent=self.servers.cache_counters(),
            transfer_at_sent=transfer_counters(decode_endpoints(self.endpoints.values())),
            kv_peak=self.server.values.get("kv_usage"),
            due_t=e.due,
            late_s=LATE_S * self.time_scale,
            ideal_cached=e.ideal_cached,
            ideal_cached_pool=e.ideal_cached_pool,
        )
        s.current, s.turn, s.state = rec, e.turn, "prefilling"
        s.recent.clear()
        s.prefill_spans.append([e.t, None])
        self.prefills.began(e.session)
        self._prefilling[e.session] = rec
        self.spans.sent(rec, e.request_id)
        self.backends.sent(rec, self.endpoints.values(), s.endpoint, self.header.endpoints if self.header else ())

    def _in_flight(self, sid: str, turn: int) -> tuple[SessionView, TurnRecord | None]:
        """The session, and its turn `turn` if that is the one in flight (an event of another attempt: None)."""
        s = self._session(sid)
        rec = s.current
        return s, rec if rec is not None and rec.turn == turn else None

    def _on_pause(self, e: ev.UserPause) -> None:
        s = self._session(e.session)
        s.pause, s.state = e, "user idle"

    def _on_first(self, e: ev.FirstToken) -> None:
        s, rec = self._in_flight(e.session, e.turn)
        if rec is None:
            return
        rec.first_t = e.t
        self.client.stamped(rec, [e.t], s.worker)
        if not e.reasoning:
            rec.answer_t = e.t
        s.state = "reasoning" if e.reasoning else "decoding"
        if s.prefill_spans and s.prefill_spans[-1][1] is None:
            s.prefill_spans[-1][1] = e.t
            self.prefills.ended(e.session, e.t)
        self._prefilling.pop(e.session, None)

    def _on_answer(self, e: ev.FirstAnswer) -> None:
        s, rec = self._in_flight(e.session, e.turn)
        if rec is None:
            return
        rec.answer_t = e.t
        s.state = "decoding"

    def _on_times(self, e: ev.TokenTimes) -> None:
        s, rec = self._in_flight(e.session, e.turn)
        if rec is None or not e.times:
            return
        times = e.chunk_times()
        # Foreign prefill spans that overlap this batch; usually none, so the
        # per-token check runs only while another session prefills.
        lo, hi = (rec.last_t if rec.last_t is not None else times[0]), times[-1]
        add_gaps(rec, times, self.prefills.others_overlapping(self.sessions, e.session, lo, hi, self.t))
        self.client.stamped(rec, times, s.worker)  # judged by its own worker's loop
        if e.piled_up is not None:  # a read of them held tokens long: this turn alone is marked
            self.client.mark(rec, e.piled_up == "own", s.worker)
        rec.chunks += len(times)
        s.chunks_arrived(times)

    def _on_client_lag(self, e: ev.ClientLag) -> None:
        self.client.apply(e)

    def _on_done(self, e: ev.TurnDone) -> None:
        s, rec = self._in_flight(e.session, e.turn)
        if rec is None:
            return
        rec.status, rec.done_t = e.status, e.t
        rec.prompt_tokens, rec.cached_tokens = e.prompt_tokens, e.cached_tokens
        rec.completion_tokens, rec.needle, rec.error = e.completion_tokens, e.needle, e.error
        rec.engine_prefill_s, rec.queued_s, rec.prefill_leg_s = e.engine_prefill_s, e.queued_s, e.prefill_leg_s
        rec.spec_accepted, rec.spec_drafted, rec.spec_steps = e.spec_accepted, e.spec_drafted, e.spec_steps
        rec.engine_decode_s = e.engine_decode_s
        rec.engine_timing = "metrics" if e.engine_prefill_s is not None else None
        if rec.span is not None:  # the span came before the response's end
            self.spans.settle(rec)
        rec.reasoning_reported, rec.reasoning_chunks = e.reasoning_tokens, e.reasoning_chunks
        rec.finish_reason, rec.reply_chars = e.finish_reason, e.reply_chars
        rec.cache_at_done = self.servers.cache_counters()
        decode = decode_endpoints(self.endpoints.values())
        covered = rec.transfer_at_sent is not None and covers(rec, decode)
        if covered and e.status == "ok":
            covered = self.transfers.attribute(rec, decode)  # else a later sample shows it
        if rec.chunks == 0:
            rec.chunks = e.chunks
        self.turns.append(rec)
        self.backends.done(rec)
        if rec.served_by is not None:  # its span came before the response's end
            self._served(rec)
        self._prefilling.pop(e.session, None)
        if e.status == "ok":
            self.usage_has_cache = bool(self.usage_has_cache) or e.cached_tokens is not None
            self.engine_timed = bool(self.engine_timed) or rec.engine_prefill_s is not None
            if rec.prompt_tokens is not None:
                s.last_prompt_tokens = rec.prompt_tokens
            s.tokens_per_chunk = rec.tokens_per_chunk
            rate = prefill_tok_s(rec)
            if decode is not None and rec.ttft and rec.kv_transferred is None:
                # The decode node reports the transferred KV as cached: the client's estimate is what was new.
                rate = rec.new_tokens_est / rec.ttft
            if rate:
                self.last_prefill_rate[e.session] = self.last_prefill_rate[""] = rate
        if s.prefill_spans and s.prefill_spans[-1][1] is None:
            s.prefill_spans[-1][1] = e.t
            self.prefills.ended(e.session, e.t)
        if e.status == "ok":
            self._add_waits(rec)  # the split is known only now: the engine's figures come with the turn's end
        s.current, s.last_done = None, rec
        s.recent.clear()
        if e.status == "ok":
            s.state = "done" if e.turn >= len(s.schedule) else "idle"
            s.needles.append(NO_ANSWER if rec.no_answer else e.needle)
            if rec.transfer_at_sent is not None and not covered:
                self.transfers.awaiting.append(rec)
            else:
                self._settle(rec, e.t)
        else:
            s.state = "failed" if e.status == "failed" else "cancelled"
            s.failed_turns += e.status == "failed"
            self._settle(rec, e.t)

    def _settle(self, rec: TurnRecord, t: float) -> None:
        """A finished turn's figures are final: mark it for --warmup, judge it by --slo (ramp sessions only),
        log its line and hand it to the readers of `settled`."""
        view = self.sessions.get(rec.session)
        rec.in_warmup = self.steady.add(rec, view.order if view is not None else 0)
        self.late_turns += rec.late and not rec.in_warmup
        if view is not None and view.role == "ramp":
            self.goodput.judge(rec, t)
        self.settled.append(rec)
        if rec.status == "ok":
            self.log.add(LogEntry(t, "info", "", rec))
        else:
            level = "error" if rec.status == "failed" else "warn"
            said = f"{rec.session} turn {rec.turn} {rec.status}: {rec.error or ''}".rstrip(": ")
            self.log.add(LogEntry(t, level, said))

    def _on_metrics(self, e: ev.MetricsSample) -> None:
        ep = self.servers.sample(e, self.header)
        kv = self.server.values.get("kv_usage")
        if kv is not None:
            for s in self.sessions.values():
                rec = s.current
                if rec is not None:
                    own = self.endpoints.get(s.endpoint)
                    here = own.values.get("kv_usage", kv) if own is not None else kv  # its own server where known
                    rec.kv_peak = here if rec.kv_peak is None else max(rec.kv_peak, here)
        if self.transfers.awaiting and ep.role == "decode":
            self._settle_transfers(e.t, final=False)
        if self.backends.awaiting:
            for rec in self.backends.sampled(self.endpoints.values()):
                self._served(rec)

    def _on_metrics_error(self, e: ev.MetricsError) -> None:
        if (said := self.servers.error(e, self.header)) is not None:
            self.log.add(said)

    @property
    def gpus(self) -> list[ev.GpuReading]:
        """Every source's GPUs, by node then index."""
        return self.gpu_fleet.readings

    @property
    def gpu_reason(self) -> str | None:
        return self.gpu_fleet.reason

    def _on_gpu(self, e: ev.GpuSample) -> None:
        self.servers.gpu(e)

    def _on_gpu_missing(self, e: ev.GpuUnavailable) -> None:
        if (said := self.servers.gpu_missing(e)) is not None:
            self.log.add(said)

    def _on_mark(self, e: ev.Mark) -> None:
        self.log.add(LogEntry(e.t, "mark", f"mark: {e.note}"))

    def _on_notice(self, e: ev.Notice) -> None:
        if e.topic == "recording":
            self.recording_error = e.message if e.level == "error" else None
        self.log.add(LogEntry(e.t, e.level, e.message))

    def _served(self, rec: TurnRecord) -> None:
        """A turn's backend became known (or ambiguous) after it may have finished: its session's moves again."""
        view = self.sessions.get(rec.session)
        if rec.status == "running" or view is None:
            return
        self._turns_settled += 1
        if rec.status == "ok" and rec.served_by is not None:
            view.backends[rec.turn] = rec.served_by
            view.moves = moves_of(view.backends)

    def _on_span(self, e: ev.EngineSpan) -> None:
        before = self.spans.unmatched
        span_of = self.spans.by_request_id.get(e.request_id)
        if span_of is not None and self.backends.span(span_of, e):
            self._served(span_of)
        rec = self.spans.arrived(e)
        if rec is None:  # unmatched (said once), or a retried span already here
            if before == 0 and self.spans.unmatched:
                self.log.add(LogEntry(e.t, "warn", f"OTLP span {e.request_id or '(no request id)'} matches no turn"))
            return
        if rec.status != "running":
            self._turns_settled += 1
        if rec.status == "ok" and rec.engine_timing == "span":  # late: the turn's line said no engine figures
            self.engine_timed = True
            self.log.add(LogEntry(e.t, "info", "span: ", rec))
            self._add_waits(rec)

    def _add_waits(self, rec: TurnRecord) -> None:
        """The parts of a timed turn's wait, for the decode lanes, kept in time order (a late span's turn may
        have ended before the session's newest one)."""
        parts = wait_parts(rec)
        view = self.sessions.get(rec.session)
        if not parts or view is None:
            return
        self.front_end_timed = self.front_end_timed or any(part == "front end" for part, _, _ in parts)
        view.add_waits(parts)

    def _on_trace_error(self, e: ev.TraceReceiverError) -> None:
        self.spans.error(e)
        self.log.add(LogEntry(e.t, "warn", f"OTLP receiver refused a request: {e.error}"))

    def _on_ended(self, e: ev.RunEnded) -> None:
        self._settle_transfers(e.t, final=True)
        for rec in self.backends.sampled(self.endpoints.values(), final=True):
            self._served(rec)
        self.ended = e
        if e.status == "crashed":
            self.log.add(LogEntry(e.t, "error", f"run crashed (exit {e.exit_code}): {e.error or 'unknown cause'}"))
        else:
            self.log.add(LogEntry(e.t, "info", f"run {e.status} (exit {e.exit_code})"))

    def _settle_transfers(self, t: float, final: bool) -> None:
        """Settle the waiting split turns the decode servers' counters now cover (all of them at the end)."""
        for rec in self.transfers.settle(decode_endpoints(self.endpoints.values()), final):
            self._turns_settled += 1
            self._settle(rec, t)

    def prefilling(self) -> list[TurnRecord]:
        """The turns waiting for their first token (a copy: the exporter's thread reads it too)."""
        return list(self._prefilling.values())

    def split(self) -> tuple[list[EndpointView], list[EndpointView]] | None:
        """(prefill, decode) endpoints of a prefill/decode split that have answered; None if not split."""
        return split(self.endpoints.values())


def _recorded(parse: Callable[[str], T], text: str | None) -> T | None:
    """A recorded flag's value (--slo, --warmup); None where none was given, or a hand-edited header's no longer
    reads: the run is then read without it (no verdicts, nothing left out), rather than not at all."""
    try:
        return parse(text) if text else None
    except ValueError:
        return None


_HANDLERS = {
    ev.SessionPlanned: RunState._on_planned,
    ev.RequestSent: RunState._on_sent,
    ev.FirstToken: RunState._on_first,
    ev.FirstAnswer: RunState._on_answer,
    ev.TokenTimes: RunState._on_times,
    ev.UserPause: RunState._on_pause,
    ev.TurnDone: RunState._on_done,
    ev.MetricsSample: RunState._on_metrics,
    ev.MetricsError: RunState._on_metrics_error,
    ev.GpuSample: RunState._on_gpu,
    ev.GpuUnavailable: RunState._on_gpu_missing,
    ev.Mark: RunState._on_mark,
    ev.Notice: RunState._on_notice,
    ev.ClientLag: RunState._on_client_lag,
    ev.EngineSpan: RunState._on_span,
    ev.TraceReceiverError: RunState._on_trace_error,
    ev.WorkerStarted: RunState._on_worker_started,
    ev.WorkerClock: lambda state, e: state.workers.clock(e),
    ev.WorkerLost: lambda state, e: state.workers.lost(e),
    ev.RunEnded: RunState._on_ended,
}
