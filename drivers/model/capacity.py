"""One point of a capacity curve (an open-loop run at one arrival rate: what was offered, what came through,
what met the SLO, how the server held up), and the rule that calls a server saturated while a point runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from rampwatch.drivers.model.goodput import steady, steady_minutes, warmup_of
from rampwatch.drivers.model.slo import latency_from
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import quantile
from rampwatch.drivers.model.turns import new_tokens

if TYPE_CHECKING:
    from rampwatch.drivers.model.analysis import Report

PER_128K = 131_072  # TTFT is compared across turns of different sizes per 128K new tokens
SATURATION_WINDOW_S = 60.0  # how long the waiting queue must grow before a point is called saturated


class CapacityPoint(msgspec.Struct, kw_only=True):
    """An open-loop run seen as one point of the curve; rates are per minute of its steady window (from --warmup's
    end, else the run's start, to its last event), and the turn figures leave the warmup's turns out."""

    offered_per_min: float  # the arrival rate asked for
    arrived: int  # conversations that arrived
    minutes: float  # the steady window's length, from the warmup's end (else the run's start) to its last event
    turns: int  # finished attempts past the warmup (failed ones included)
    turns_per_min: float | None  # achieved
    slo: str | None  # the SLO judged (None: none asked for)
    goodput_turns_per_min: float | None  # turns meeting the SLO, per minute
    goodput_share: float | None  # turns meeting the SLO / turns judged
    ttft_p50_per_128k_s: float | None  # TTFT from the turn's due time, per 128K new tokens
    ttft_p99_per_128k_s: float | None
    waiting_peak: float | None  # the most requests the server had waiting at once
    kv_peak: float | None
    preemptions: float | None
    failed_turns: int
    status: str | None  # how the run ended: done, time-limit, saturated, ...
    mean_conversation_s: float | None  # a finished conversation's length, arrival to its last reply
    kv_fits: int | None  # conversations as long as the longest one that fit in one engine's KV pool
    warmup: str | None = None  # what --warmup left out, in words (None: nothing)


def capacity_point(state: RunState, report: Report) -> CapacityPoint | None:
    """The run's point on the curve; None for a run that was not open loop (--arrivals)."""
    h = state.header
    if h is None or not h.arrivals_per_s or report.open_loop is None:
        return None
    ramp = {s.id for s in report.sessions}
    warm = warmup_of(state)
    recs, start = steady(state, [r for r in state.turns if r.session in ramp], warm)
    per_128k = sorted(
        (r.first_t - latency_from(r)) * PER_128K / n
        for r in recs
        if r.status == "ok" and r.first_t is not None and (n := new_tokens(r)) > 0
    )
    minutes = steady_minutes(state, start)
    done = [r for r in recs if r.status != "running"]
    g = report.goodput
    return CapacityPoint(
        offered_per_min=h.arrivals_per_s * 60,
        arrived=report.open_loop.arrived,
        minutes=minutes,
        turns=len(done),
        turns_per_min=len(done) / minutes if minutes > 0 else None,
        slo=g.slo if g is not None else None,
        goodput_turns_per_min=g.turns_met_per_min if g is not None else None,
        goodput_share=g.turns_met / g.turns if g is not None and g.turns else None,
        ttft_p50_per_128k_s=quantile(per_128k, 0.5) if per_128k else None,
        ttft_p99_per_128k_s=quantile(per_128k, 0.99) if per_128k else None,
        waiting_peak=state.server.waiting_peak,
        kv_peak=state.server.kv_peak,
        preemptions=state.preemptions_this_run(),
        failed_turns=sum(1 for r in recs if r.status == "failed"),
        status=state.ended.status if state.ended is not None else None,
        mean_conversation_s=_mean_conversation_s(state, ramp),
        kv_fits=state.kv_fits_sequences(),
        warmup=warm.text() if warm is not None else None,
    )


def _mean_conversation_s(state: RunState, ramp: set[str]) -> float | None:
    """How long a conversation that finished every turn lasted, from its arrival to its last reply, on average."""
    lengths = []
    for sid in ramp:
        s = state.sessions.get(sid)
        recs = [r for r in state.turns if r.session == sid]
        if s is None or s.arrival is None or s.state != "done" or not recs or recs[-1].done_t is None:
            continue
        lengths.append(recs[-1].done_t - s.arrival)
    return sum(lengths) / len(lengths) if lengths else None


def overload(state: RunState) -> str | None:
    """A sign the server is past what it can carry, or None: a turn failed, or the server preempted."""
    failed = sum(1 for r in state.turns if r.status == "failed")
    if failed:
        return f"{failed} turn(s) failed"
    preempted = state.preemptions_this_run()
    if preempted:
        return f"the server preempted {preempted:.0f} time(s)"
    return None


def saturation(state: RunState, window_s: float = SATURATION_WINDOW_S) -> str | None:
    """Why the server cannot keep up, or None: overload, or its waiting queue never emptied for `window_s` while
    its floor rose (the low of the window's second half above its first half's)."""
    if reason := overload(state):
        return reason
    history = state.server.waiting_history
    if not history or history[-1][0] - history[0][0] < window_s:
        return None
    now = history[-1][0]
    recent = [(t, w) for t, w in history if t >= now - window_s]
    if any(w <= 0 for _, w in recent):
        return None
    middle = now - window_s / 2
    first = min(w for t, w in recent if t < middle) if any(t < middle for t, _ in recent) else None
    second = min(w for t, w in recent if t >= middle)
    if first is None or second <= first:
        return None
    now_waiting = recent[-1][1]
    return f"the waiting queue grew for {window_s:g}s (at least {first:.0f}, then {second:.0f}, now {now_waiting:.0f})"
