"""Per-turn rows, per-session summaries, interference: the numbers a report prints.

Pure functions of a RunState, which is itself a pure fold of the events, so a
live run, its replay and `rampwatch report` print the same figures.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rampwatch.drivers.model.affinity import Affinity, RunAffinity, run_affinity, session_affinity
from rampwatch.drivers.model.client_check import ClientWorker, client_workers
from rampwatch.drivers.model.deployment import router_workers
from rampwatch.drivers.model.endpoints import EndpointView, is_router
from rampwatch.drivers.model.events import Endpoint, PromptShape, TraceRun
from rampwatch.drivers.model.gaps import GapStats, gap_stats, split_decode_rates
from rampwatch.drivers.model.goodput import Goodput, OpenLoop, goodput, open_loop, ramp_ids
from rampwatch.drivers.model.panels import last_turn_hit_rate
from rampwatch.drivers.model.reuse import Reuse, reuse
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turn_row import TurnRow, turn_row
from rampwatch.drivers.model.turns import TurnRecord
from rampwatch.drivers.model.workers import WorkerFigures, worker_figures

REPORT_SCHEMA = 11  # the JSON report's schema (docs/measurement.md: "The JSON report"); bump on any change


class SessionSummary(msgspec.Struct):
    ttft_sum_s: float
    ttft_max_s: float
    decode_tok_s_median: float | None
    needle_found: int
    needle_no_answer: int  # turns cut at the token cap before any answer
    reasoning_tokens: int  # summed over the turns
    ttfa_sum_s: float  # summed time to first answer token (answered turns)
    turns: int  # finished attempts (failed ones included)
    planned_turns: int
    reached_turn: int  # the last turn that finished ok (a time limit can stop a ramp early)
    gaps_alone: GapStats | None
    gaps_during_foreign_prefill: GapStats | None
    queued_sum_s: float | None = None  # the engine's queue time summed over the turns it timed (None: none)
    engine_prefill_sum_s: float | None = None  # the engine's prefill time summed likewise
    # The rest of the TTFT split by the engine's own TTFT (its spans), summed over the turns that have it.
    front_end_sum_s: float | None = None  # the server's front end
    client_sum_s: float | None = None  # the client's side: the network, the HTTP server, the client


class SessionReport(msgspec.Struct):
    id: str
    turns: list[TurnRow]
    summary: SessionSummary
    affinity: Affinity | None = None  # whether it stayed on its first backend (None: no turn's backend was told)


class RunInfo(msgspec.Struct):
    schema: int
    rampwatch_version: str
    server: str
    model: str
    engine: str
    started_at: str
    sessions: int
    status: str | None  # how the run ended (done, failed, interrupted, crashed, time-limit); None: still running
    lockstep: bool
    needle_mode: str
    one_shot: bool
    time_limit_s: float | None
    extra_body: dict[str, Any]  # --extra-body as recorded
    request_headers: dict[str, str]  # --header as recorded (credentials hidden)
    reasoning: str  # --reasoning: off, on or auto (the server's default)
    max_tokens: int | None  # --max-tokens: the cap on reasoning + answer; None: the answer budget (output_tokens)
    output_tokens: int
    prompts: PromptShape | None = None  # the shared lead, the corpus and the think time (None: none of them)
    # A demo's simulated engine ran this many times faster than real time; every time and rate in the report is
    # modelled (the recorded times multiplied by it). None: real time.
    time_scale: float | None = None
    trace: TraceRun | None = None  # --trace: the trace the sessions came from (None: a ramp)


class Interference(msgspec.Struct):
    decode_tok_s_alone_median: float | None
    decode_tok_s_during_foreign_prefill_median: float | None
    overlapping_turns: int
    gaps_alone: GapStats | None
    gaps_during_foreign_prefill: GapStats | None
    # Over the turns in turn_spread the engine timed: how much longer the slowest session waited than the fastest,
    # and how much of that was the engine's queue (it waited behind another session's prefill).
    extra_wait_s: float | None = None
    extra_wait_queued_s: float | None = None


class TurnSpread(msgspec.Struct):
    """One turn across the ramp sessions: how much longer the slowest waited."""

    turn: int
    slowest_ttft_s: float
    fastest_ttft_s: float
    ratio: float
    extra_queued_s: float | None = None  # the slowest session's engine queue time less the fastest's (None: untimed)


class RampVsOneShot(msgspec.Struct):
    session: str
    ramp_ttft_sum_s: float
    ramp_ttft_max_s: float
    sum_ratio: float  # ramp summed TTFT / one-shot TTFT
    longest_ratio: float  # longest ramp wait / one-shot TTFT


class OneShot(msgspec.Struct):
    """The baseline turn: one fresh prompt as long as the ramp's last turn."""

    turn: TurnRow
    ramps: list[RampVsOneShot]


class ServerSummary(msgspec.Struct):
    kv_peak: float | None
    hit_rate_last_turn: float | None


class ServerFigures(msgspec.Struct):
    """One endpoint (or a sum of them) over the run: token counts since it
    first answered, and rates over the time it answered."""

    name: str
    role: str  # prefill | decode | both
    engine: str | None
    answered_s: float | None  # first to last scrape
    prompt_tokens: float | None
    prompt_computed_tokens: float | None
    prefix_query_tokens: float | None
    prefix_hit_tokens: float | None
    generation_tokens: float | None
    preemptions: float | None
    hit_rate: float | None
    prefill_tok_s: float | None  # computed prompt tokens per second answered
    decode_tok_s: float | None
    kv_peak: float | None
    kv_capacity_tokens: float | None
    last_error: str | None
    transferred_tokens: float | None = None  # KV a split's decode server received (vLLM: external_kv_transfer)
    workers: dict[str, float] | None = None  # a router: the requests it sent each worker (None: not a router)
    router_retries: float | None = None  # a router: the requests it retried since it first answered
    router_errors: float | None = None  # ... and the requests it answered with an error


class Report(msgspec.Struct):
    run: RunInfo
    sessions: list[SessionReport]
    interference: Interference
    server: ServerSummary
    turn_spread: list[TurnSpread]  # per turn, with two or more ramp sessions
    ttft_ratio_median: float | None  # median of turn_spread's ratios
    one_shot: OneShot | None
    servers: list[ServerFigures]  # one per endpoint that answered
    servers_total: ServerFigures | None  # their sum
    roles: list[ServerFigures]  # summed by role (prefill, decode, both)
    client_lag_max_ms: float | None  # the driver's worst event-loop lag (None: not measured, older recordings)
    # ... of its own work: the CPU it spent in the pass that held its loop (drivers/run/event_loop.py)
    client_lag_own_max_ms: float | None
    spans: SpanFigures | None = None  # the engine's OTLP trace spans (--otlp); None: none arrived
    open_loop: OpenLoop | None = None  # --arrivals: the arrivals and the late turns (None: closed loop)
    goodput: Goodput | None = None  # --slo: the turns and conversations that met it (None: no SLO given)
    reuse: Reuse | None = None  # --trace: the prefix-cache reuse delivered against the trace's ideal (None: no trace)
    affinity: RunAffinity | None = None  # every session's stay on its backend (None: no turn's backend was told)
    # Each driver loop's lag, CPU and busy turns (--workers N: one a worker; one driver: worker null); None: no lag
    client_workers: list[ClientWorker] | None = None
    workers: list[WorkerFigures] | None = None  # --workers N, --cluster, merged shards: each worker (None: one driver)


class SpanFigures(msgspec.Struct):
    """--otlp: the engine's trace spans over the run, joined to turns by request id."""

    matched: int
    unmatched: int  # spans of no turn of this run (another client, an older run): counted, not dropped
    refused: int  # requests the receiver answered 400 (not an OTLP export, too large)
    max_disagreement_ms: float | None  # spans vs the per-request metrics on the turns with both (None: no such turn)


MIN_INTERVALS = 3  # decode intervals a turn needs before its split rate counts


def _sum(values: list[float | None]) -> float | None:
    """The sum of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _summary(state: RunState, sid: str, rows: list[TurnRow], records: list[TurnRecord]) -> SessionSummary:
    ttfts = [r.ttft_s for r in rows if r.ttft_s is not None]
    return SessionSummary(
        ttft_sum_s=sum(ttfts),
        ttft_max_s=max(ttfts, default=0.0),
        decode_tok_s_median=median([r.decode_tok_s for r in rows if r.decode_tok_s is not None]),
        needle_found=sum(1 for r in rows if r.needle),
        needle_no_answer=sum(1 for r in rows if r.no_answer),
        reasoning_tokens=sum(r.reasoning_tokens for r in rows),
        ttfa_sum_s=sum(r.ttfa_s for r in rows if r.ttfa_s is not None),
        turns=len(rows),
        planned_turns=len(state.sessions[sid].schedule),
        reached_turn=max((r.turn for r in records if r.status == "ok"), default=0),
        gaps_alone=gap_stats([g for r in records for g in r.gaps_alone]),
        gaps_during_foreign_prefill=gap_stats([g for r in records for g in r.gaps_during]),
        queued_sum_s=_sum([r.queued_s for r in rows]),
        engine_prefill_sum_s=_sum([r.engine_prefill_s for r in rows]),
        front_end_sum_s=_sum([r.ttft_front_end_s for r in rows]),
        client_sum_s=_sum([r.ttft_client_s for r in rows]),
    )


def turn_spread(state: RunState, ramp: list[str]) -> list[TurnSpread]:
    """Per turn: the slowest and fastest ramp session's TTFT (turns every ramp session finished)."""
    by_turn: dict[int, list[TurnRecord]] = {}
    for rec in state.turns:
        if rec.session in ramp and rec.status == "ok" and rec.ttft is not None:
            by_turn.setdefault(rec.turn, []).append(rec)
    out = []
    for turn, recs in sorted(by_turn.items()):
        slow = max(recs, key=lambda r: r.ttft or 0.0)
        fast = min(recs, key=lambda r: r.ttft or 0.0)
        slowest, fastest = slow.ttft or 0.0, fast.ttft or 0.0
        if len(recs) >= 2 and len(recs) == len(ramp) and fastest > 0:
            queued = None if slow.queued_s is None or fast.queued_s is None else slow.queued_s - fast.queued_s
            out.append(
                TurnSpread(
                    turn=turn,
                    slowest_ttft_s=slowest,
                    fastest_ttft_s=fastest,
                    ratio=slowest / fastest,
                    extra_queued_s=queued,
                )
            )
    return out


def build_report(state: RunState) -> Report:
    h = state.header
    listed = h.endpoints if h else []
    servers = [endpoint_figures(ep, listed) for ep in state.endpoints.values() if ep.last_sample_t is not None]
    models = [f for f in servers if f.workers is None]  # a router serves no model: not in the totals
    ramp = ramp_ids(state)
    baseline = [sid for sid, s in state.sessions.items() if s.role == "one-shot"]
    sessions: list[SessionReport] = []
    by_session = state.turns_by_session()
    for sid in ramp:
        records = by_session.get(sid, [])
        rows = [turn_row(r) for r in records]
        summary = _summary(state, sid, rows, records)
        sessions.append(SessionReport(id=sid, turns=rows, summary=summary, affinity=session_affinity(records)))
    ramp_turns = [r for r in state.turns if r.session in ramp]
    splits = [split_decode_rates(r, MIN_INTERVALS) for r in ramp_turns]
    spread = turn_spread(state, ramp)
    one_shot = None
    shot = next((r for r in state.turns if r.session in baseline and r.status == "ok"), None)
    if shot is not None and shot.ttft:
        one_shot = OneShot(
            turn=turn_row(shot),
            ramps=[
                RampVsOneShot(
                    session=s.id,
                    ramp_ttft_sum_s=s.summary.ttft_sum_s,
                    ramp_ttft_max_s=s.summary.ttft_max_s,
                    sum_ratio=s.summary.ttft_sum_s / shot.ttft,
                    longest_ratio=s.summary.ttft_max_s / shot.ttft,
                )
                for s in sessions
            ],
        )
    return Report(
        run=RunInfo(
            schema=REPORT_SCHEMA,
            rampwatch_version=h.rampwatch_version if h else "",
            server=h.server if h else "",
            model=(h.model or "") if h else "",
            engine=(h.engine or state.server.engine or "") if h else (state.server.engine or ""),
            started_at=h.started_at if h else "",
            sessions=len(ramp),
            status=state.ended.status if state.ended else None,
            lockstep=h.lockstep if h else False,
            needle_mode=h.needle_mode if h else "verbatim",
            one_shot=h.one_shot if h else False,
            time_limit_s=h.time_limit_s if h else None,
            extra_body=h.extra_body if h else {},
            request_headers=h.request_headers if h else {},
            prompts=h.prompts if h else None,
            reasoning=h.reasoning if h else "auto",
            max_tokens=h.max_tokens if h else None,
            output_tokens=h.output_tokens if h else 0,
            time_scale=h.time_scale if h else None,
            trace=h.trace if h else None,
        ),
        sessions=sessions,
        interference=Interference(
            decode_tok_s_alone_median=median([a for a, _ in splits if a is not None]),
            decode_tok_s_during_foreign_prefill_median=median([d for _, d in splits if d is not None]),
            overlapping_turns=sum(1 for r in ramp_turns if r.gaps_during),
            gaps_alone=gap_stats([g for r in ramp_turns for g in r.gaps_alone]),
            gaps_during_foreign_prefill=gap_stats([g for r in ramp_turns for g in r.gaps_during]),
            extra_wait_s=_sum([x.slowest_ttft_s - x.fastest_ttft_s for x in spread if x.extra_queued_s is not None]),
            extra_wait_queued_s=_sum([x.extra_queued_s for x in spread]),
        ),
        server=ServerSummary(kv_peak=state.server.kv_peak, hit_rate_last_turn=last_turn_hit_rate(state)),
        turn_spread=spread,
        ttft_ratio_median=median([s.ratio for s in spread]),
        one_shot=one_shot,
        servers=servers,
        servers_total=sum_figures("total", "all", models, state.server.kv_peak) if models else None,
        roles=[
            sum_figures(role, role, [f for f in servers if f.role == role])
            for role in ("prefill", "decode", "both")
            if any(f.role == role for f in servers)
        ],
        client_lag_max_ms=state.client.worst_ms,
        client_lag_own_max_ms=state.client.worst_own_ms,
        spans=span_figures(state),
        open_loop=open_loop(state),
        goodput=goodput(state),
        reuse=reuse(state),
        affinity=run_affinity(s.affinity for s in sessions),
        client_workers=client_workers(state.client),
        workers=worker_figures(state.workers),
    )


def endpoint_figures(ep: EndpointView, listed: list[Endpoint] | None = None) -> ServerFigures:
    grown, v = ep.since_start(), ep.values
    span = (
        ep.last_sample_t - ep.first_sample_t if ep.first_sample_t is not None and ep.last_sample_t is not None else None
    )
    computed = grown.get("prompt_computed", grown.get("prompt_tokens"))

    def per_s(n: float | None) -> float | None:
        return n / span if n is not None and span else None

    return ServerFigures(
        name=ep.name,
        role=ep.role,
        engine=ep.engine,
        answered_s=span,
        prompt_tokens=grown.get("prompt_tokens"),
        prompt_computed_tokens=grown.get("prompt_computed"),
        prefix_query_tokens=grown.get("prefix_queries"),
        prefix_hit_tokens=grown.get("prefix_hits"),
        generation_tokens=grown.get("generation_tokens"),
        preemptions=grown.get("preemptions"),
        hit_rate=ep.hit_rate_since_start(),
        prefill_tok_s=per_s(computed),
        decode_tok_s=per_s(grown.get("generation_tokens")),
        kv_peak=ep.kv_peak,
        kv_capacity_tokens=v.get("kv_capacity_tokens"),
        last_error=ep.error,
        transferred_tokens=grown.get("kv_transferred"),
        workers=router_workers(ep, listed or []) if is_router(ep) else None,
        router_retries=grown.get("router_retries") if is_router(ep) else None,
        router_errors=grown.get("router_errors") if is_router(ep) else None,
    )


def sum_figures(name: str, role: str, figs: list[ServerFigures], kv_peak: float | None = None) -> ServerFigures:
    """Endpoints taken together: counts and rates add up; the hit rate is of the summed tokens."""

    def total(attr: str) -> float | None:
        xs = [getattr(f, attr) for f in figs if getattr(f, attr) is not None]
        return sum(xs) if xs else None

    queries, hits = total("prefix_query_tokens"), total("prefix_hit_tokens")
    return ServerFigures(
        name=name,
        role=role,
        engine="/".join(sorted({f.engine or "?" for f in figs})) or None,
        answered_s=max((f.answered_s for f in figs if f.answered_s is not None), default=None),
        prompt_tokens=total("prompt_tokens"),
        prompt_computed_tokens=total("prompt_computed_tokens"),
        prefix_query_tokens=queries,
        prefix_hit_tokens=hits,
        generation_tokens=total("generation_tokens"),
        preemptions=total("preemptions"),
        hit_rate=hits / queries if queries and hits is not None else None,
        prefill_tok_s=total("prefill_tok_s"),
        decode_tok_s=total("decode_tok_s"),
        kv_peak=kv_peak
        if kv_peak is not None
        else max((f.kv_peak for f in figs if f.kv_peak is not None), default=None),
        kv_capacity_tokens=total("kv_capacity_tokens"),
        last_error=None,
        transferred_tokens=total("transferred_tokens"),
    )


def span_figures(state: RunState) -> SpanFigures | None:
    """The spans' account of the run, where any span (or refused export) arrived."""
    led = state.spans
    if not (led.matched or led.unmatched or led.errors):
        return None
    worst = led.max_disagreement_s
    return SpanFigures(
        matched=led.matched,
        unmatched=led.unmatched,
        refused=led.errors,
        max_disagreement_ms=None if worst is None else worst * 1000,
    )
