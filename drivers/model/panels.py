"""What the panels ask of the folded state: the Sessions panel's summary line, the decode chart's columns and
shading, the prefills in flight, the server's and GPUs' figures. Read-only functions of a RunState; widgets
draw what these return and compute nothing of their own."""

from __future__ import annotations

import math

from rampwatch.drivers.model import deployment
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.deployment import kv_fits_sequences
from rampwatch.drivers.model.endpoints import COUNTERS, EndpointView, is_router
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turns import hit_rate
from rampwatch.drivers.model.views import GENERATING, PrefillProgress, SessionsAggregate, SessionView


def aggregate(state: RunState) -> SessionsAggregate:
    """Sessions by state, TTFT p50/max of their last turns, decode tok/s p50/min now."""
    by_state: dict[str, int] = {}
    ttfts, rates = [], []
    arrived = live = waiting = 0
    for s in state.sessions.values():
        by_state[s.state] = by_state.get(s.state, 0) + 1
        if s.arrival is not None:
            arrived += 1
            if state.ended is None:  # once the run ended, nothing is live or waits any more
                waiting += s.waiting
                live += not s.waiting and s.state not in ("done", "failed", "cancelled")
        if s.last_done is not None and s.last_done.ttft is not None:
            ttfts.append(s.last_done.ttft)
        if s.state in GENERATING and (r := s.decode_rate_now()) is not None:
            rates.append(r)
    return SessionsAggregate(
        total=len(state.sessions),
        by_state=by_state,
        ttft_p50=median(ttfts),
        ttft_max=max(ttfts, default=None),
        decode_p50=median(rates),
        decode_min=min(rates, default=None),
        arrivals=(arrived, live, waiting) if arrived else None,
    )


def timeline_aggregate(state: RunState, first_bucket: int, n: int) -> tuple[list[float], list[float]]:
    """Per bucket, across the sessions that decoded in it: decode tok/s p50 and min."""
    columns: list[list[float]] = [[] for _ in range(n)]
    for s in state.sessions.values():
        if s.timeline_first + len(s.timeline) <= first_bucket:
            continue  # nothing decoded in the window (a trace's finished sessions)
        for i, v in enumerate(s.timeline_values(first_bucket, n)):
            if v > 0:
                columns[i].append(v)
    return ([median(c) or 0.0 for c in columns], [min(c) if c else 0.0 for c in columns])


def prefill_progress(state: RunState, now: float) -> list[PrefillProgress]:
    """Each waiting prefill: elapsed time and, from the session's (or else the run's) last prefill rate, the
    expected total wait."""
    out = []
    for rec in state.prefilling():
        rate = state.last_prefill_rate.get(rec.session) or state.last_prefill_rate.get("")
        out.append(
            PrefillProgress(
                session=rec.session,
                turn=rec.turn,
                new_tokens=rec.new_tokens_est,
                elapsed=rec.prefill_elapsed(now) or 0.0,
                expected=rec.new_tokens_est / rate if rate else None,
            )
        )
    return out


def prefills_in_window(state: RunState, start: float, end: float, now: float) -> list[tuple[str, float, float]]:
    """Every (session, from, to) prefill that overlaps [start, end), one still in flight ending `now`: one walk
    of the sessions for a whole chart (a trace's thousands, nearly all long past)."""
    out = []
    for sid, o in state.sessions.items():
        for a, b in reversed(o.prefill_spans):  # a session's spans follow one another: newest first
            b = now if b is None else b
            if b <= start:
                break  # this and every older span ended before the window
            if a < end:
                out.append((sid, a, b))
    return out


def foreign_prefill_cells(
    state: RunState,
    session: str,
    start: float,
    step: float,
    n: int,
    now: float,
    spans: list[tuple[str, float, float]] | None = None,
) -> list[bool]:
    """For n time cells of `step` seconds from `start`: whether another session had a prefill in flight during
    each one (for the chart's shading); `spans`: prefills_in_window's, when a chart of many lanes has them."""
    cells = [False] * n
    if spans is None:
        spans = prefills_in_window(state, start, start + n * step, now)
    for sid, a, b in spans:
        if sid == session:
            continue
        first = max(0, int((a - start) // step))
        last = min(n - 1, math.ceil((b - start) / step) - 1)  # a span ending on a cell edge stops before it
        for i in range(first, last + 1):
            cells[i] = True
    return cells


def gpu_nodes(state: RunState) -> list[tuple[str, list[ev.GpuReading]]]:
    """The GPUs grouped by node, in order."""
    nodes: dict[str, list[ev.GpuReading]] = {}
    for g in state.gpus:
        nodes.setdefault(g.node, []).append(g)
    return list(nodes.items())


def metrics_errors(state: RunState) -> dict[str, str]:
    """Each endpoint whose last scrape failed, and why."""
    return {name: ep.error for name, ep in state.endpoints.items() if ep.error}


def counters(state: RunState) -> dict[str, float]:
    """The servers' counters, as growth since each first answered."""
    v = state.server.values
    return {k: v[k] for k in COUNTERS if k in v}


def last_turn_hit_rate(state: RunState) -> float | None:
    """The hit rate of the last turn that finished ok."""
    last = next((r for r in reversed(state.turns) if r.status == "ok"), None)
    return None if last is None else hit_rate(last)


def hit_rate_since_start(state: RunState) -> float | None:
    """The prefix cache's hit rate over the run, from the servers' counters."""
    return state.server.hit_rate_since_start()


def preemptions_this_run(state: RunState) -> float | None:
    return state.server.values.get("preemptions")  # counters are growth since each server first answered


def engine_timing_missing(state: RunState) -> bool:
    """The engine timed none of the finished turns (a hint at the server flag is due); False while some turn was
    timed, before any turn finished, or while the run receives the engine's spans (--otlp) and has not ended:
    they come seconds after their turns."""
    if state.engine_timed is not False:
        return False
    return not (state.header is not None and state.header.spans_expected and state.ended is None)


def engine_name(state: RunState) -> str | None:
    """The engine as its metrics (else the recording's header) name it."""
    return state.server.engine or (state.header.engine if state.header is not None else None)


def kv_fits(state: RunState) -> int | None:
    """Sequences as long as the longest session that fit in one engine's KV pool (deployment.kv_fits_sequences)."""
    return kv_fits_sequences(state.endpoints.values(), state.sessions.values())


def turn_place(state: RunState, s: SessionView) -> tuple[str, str] | None:
    """Where a prefill/decode split has the session's turn (deployment.turn_place)."""
    return deployment.turn_place(state.endpoints.values(), s)


def router_workers(state: RunState, ep: EndpointView) -> dict[str, float] | None:
    """A router endpoint's requests per worker since it first answered, by the workers' endpoint names (None: not
    a router)."""
    if not is_router(ep):
        return None
    return deployment.router_workers(ep, state.header.endpoints if state.header else [])
