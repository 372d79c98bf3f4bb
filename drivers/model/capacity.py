"""One point of a capacity curve (an open-loop run at one arrival rate: what was offered, what came through,
what met the SLO, how the server held up), and the rule that calls a server saturated while a point runs."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.deployment import kv_fits_sequences
from rampwatch.drivers.model.goodput import goodput, open_loop, per_min, ramp_ids, steady_minutes, steady_turns
from rampwatch.drivers.model.panels import preemptions_this_run
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import quantile
from rampwatch.drivers.model.turns import new_tokens
from rampwatch.drivers.model.workers import LOST

PER_128K = 131_072  # TTFT is compared across turns of different sizes per 128K new tokens
SATURATION_WINDOW_S = 60.0  # how long the waiting queue must grow before a point is called saturated


class CapacityPoint(msgspec.Struct, kw_only=True):
    """An open-loop run (--arrivals, or a replayed --trace) seen as one point of the curve; rates are per minute
    of its steady window (from --warmup's end, else the run's start, to its last event), and the turn figures leave
    the warmup's turns out."""

    offered_per_min: float  # the arrival rate asked for (a trace's: its sessions starting a minute, at its speed)
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
    trace_speed: float | None = None  # a replayed trace's --trace-speed


def capacity_point(state: RunState) -> CapacityPoint | None:
    """The run's point on the curve; None for a run that was not open loop (--arrivals, --trace)."""
    arrivals = open_loop(state)
    if arrivals is None:
        return None
    recs = steady_turns(state)
    per_128k = sorted(
        ttft * PER_128K / n
        for r in recs
        if r.status == "ok" and (ttft := r.user_ttft) is not None and (n := new_tokens(r)) > 0
    )
    minutes = steady_minutes(state)
    done = [r for r in recs if r.status != "running"]
    g = goodput(state)
    return CapacityPoint(
        offered_per_min=arrivals.arrivals_per_min,
        arrived=arrivals.arrived,
        minutes=minutes,
        turns=len(done),
        turns_per_min=per_min(len(done), minutes),
        slo=g.slo if g is not None else None,
        goodput_turns_per_min=g.turns_met_per_min if g is not None else None,
        goodput_share=g.turns_met / g.turns if g is not None and g.turns else None,
        ttft_p50_per_128k_s=quantile(per_128k, 0.5) if per_128k else None,
        ttft_p99_per_128k_s=quantile(per_128k, 0.99) if per_128k else None,
        waiting_peak=state.server.waiting_peak,
        kv_peak=state.server.kv_peak,
        preemptions=preemptions_this_run(state),
        failed_turns=sum(1 for r in recs if r.status == "failed"),
        status=state.ended.status if state.ended is not None else None,
        mean_conversation_s=_mean_conversation_s(state, set(ramp_ids(state))),
        kv_fits=kv_fits_sequences(state.endpoints.values(), state.sessions.values()),
        warmup=arrivals.warmup,
        trace_speed=arrivals.trace_speed,
    )


def kept_share(point: CapacityPoint, share: float) -> bool:
    """Whether a point kept the SLO share (--find-max's test of a rate): it was not stopped as saturated, and at
    least `share` of its judged turns met the SLO."""
    return point.status != "saturated" and point.goodput_share is not None and point.goodput_share >= share


def _mean_conversation_s(state: RunState, ramp: set[str]) -> float | None:
    """How long a conversation that finished every turn lasted, from its arrival to its last reply, on average."""
    lengths = []
    by_session = state.turns_by_session()
    for sid in ramp:
        s = state.sessions.get(sid)
        recs = by_session.get(sid, [])
        if s is None or s.arrival is None or s.state != "done" or not recs or recs[-1].done_t is None:
            continue
        lengths.append(recs[-1].done_t - s.arrival)
    return sum(lengths) / len(lengths) if lengths else None


def overload(state: RunState) -> str | None:
    """A sign the server is past what it can carry, or None: a turn failed, or the server preempted. A turn lost
    with its driver worker (--workers) is the client's failure, and says nothing of the server."""
    failed = sum(1 for r in state.turns if r.status == "failed" and r.error != LOST)
    if failed:
        return f"{counted(failed, 'turn')} failed"
    preempted = preemptions_this_run(state)
    if preempted:
        return f"the server preempted {counted(round(preempted), 'time')}"
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
