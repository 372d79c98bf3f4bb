"""The report's figures of an open-loop run (--arrivals: how users arrived, the turns sent late) and of an
SLO (--slo: goodput, the turns and conversations that met it), each with --warmup's turns left out. Every
figure here is read off the fold: the turns' own marks (in_warmup, slo_met, late), its GoodputTally and its
steady window, so the live header and the exporter count exactly what the report does."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.model.events import Header
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turns import TurnRecord


class OpenLoop(msgspec.Struct):
    """An open-loop run (--arrivals, or a --trace replayed): how conversations arrived and how late the client
    sent turns."""

    arrivals_per_min: float
    seed: int | None
    max_live: int | None
    arrived: int  # conversations that arrived (were planned)
    late_turns: int  # turns past the warmup sent more than 10 ms after their due time
    send_lag_max_s: float | None
    ttft_from_due_p50_s: float | None
    ttft_from_send_p50_s: float | None
    warmup: str | None = None  # what --warmup left out of the turn figures, in words (None: nothing)
    trace_speed: float | None = None  # a replayed trace's --trace-speed (its sessions arrived as it has them)


class Goodput(msgspec.Struct):
    """--slo: turns meeting every bound, and conversations all of whose turns did, in total and per minute of
    the run (from its start to its last event)."""

    slo: str
    turns_met: int
    turns: int  # finished attempts judged (failed ones count as not met)
    conversations_met: int
    conversations: int  # ramp conversations that ran at least one turn
    minutes: float  # the window counted: from the warmup's end (else the run's start) to the last event
    turns_met_per_min: float | None
    conversations_met_per_min: float | None
    warmup: str | None = None  # what --warmup left out, in words (None: nothing)
    warmup_turns: int = 0  # turns left out


def ramp_ids(state: RunState) -> list[str]:
    """The ramp sessions (not the one-shot baseline), in the order they were planned."""
    return [sid for sid, s in state.sessions.items() if s.role == "ramp"]


def steady_turns(state: RunState) -> list[TurnRecord]:
    """The ramp sessions' finished turns past --warmup."""
    ramp = set(ramp_ids(state))
    return [r for r in state.turns if r.session in ramp and not r.in_warmup]


def steady_minutes(state: RunState) -> float:
    """The steady window's length in minutes: from its start to the run's last event."""
    return state.steady.minutes(state.ended.t if state.ended is not None else state.t)


def per_min(count: int, minutes: float) -> float | None:
    return count / minutes if minutes > 0 else None


def warmup_text(state: RunState) -> str | None:
    warm = state.steady.warmup
    return warm.text() if warm is not None else None


def offered_per_s(h: Header | None) -> float | None:
    """The conversations a run offered a second: --arrivals, or a replayed trace's sessions starting a second at
    its speed (None: a closed loop, or a trace whose sessions all start at once)."""
    if h is None:
        return None
    if h.arrivals_per_s:
        return h.arrivals_per_s
    return h.trace.sessions_per_s if h.trace is not None else None


def open_loop(state: RunState) -> OpenLoop | None:
    """How conversations arrived (all of them) and how late the turns past --warmup were sent."""
    h = state.header
    if h is None or (not h.arrivals_per_s and h.trace is None):
        return None
    rate = offered_per_s(h) or 0.0  # a trace whose sessions all start at once offers no rate
    recs = steady_turns(state)
    lags = [r.send_lag for r in recs if r.send_lag is not None]
    return OpenLoop(
        arrivals_per_min=rate * 60,
        seed=h.seed,
        max_live=h.max_live,
        arrived=len(ramp_ids(state)),
        late_turns=state.late_turns,
        send_lag_max_s=max(lags, default=None),
        ttft_from_due_p50_s=median([r.user_ttft for r in recs if r.user_ttft is not None and r.due_t is not None]),
        ttft_from_send_p50_s=median([r.ttft for r in recs if r.ttft is not None and r.due_t is not None]),
        warmup=warmup_text(state),
        trace_speed=h.trace.speed if h.trace is not None else None,
    )


def goodput(state: RunState) -> Goodput | None:
    """Turns that met the SLO, and conversations that did, over the steady window's minutes: the fold's own tally
    (--warmup's turns, and a conversation with any turn in it, left out). None without an SLO."""
    tally = state.goodput
    if tally.slo is None:
        return None
    ramp = set(ramp_ids(state))
    warm_sessions = {r.session for r in state.turns if r.in_warmup and r.session in ramp}
    ran = {r.session for r in state.turns if r.session in ramp and r.session not in warm_sessions}
    minutes = steady_minutes(state)
    met_conversations = tally.conversations_met
    return Goodput(
        slo=tally.slo.text,
        turns_met=tally.met,
        turns=tally.judged,
        conversations_met=met_conversations,
        conversations=len(ran),
        minutes=minutes,
        turns_met_per_min=per_min(tally.met, minutes),
        conversations_met_per_min=per_min(met_conversations, minutes),
        warmup=warmup_text(state),
        warmup_turns=sum(1 for r in state.turns if r.in_warmup and r.session in ramp),
    )
