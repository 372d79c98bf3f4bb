"""The report's figures of an open-loop run (--arrivals: how users arrived, the turns sent late) and of an
SLO (--slo: goodput, the turns and conversations that met it), each with --warmup's turns left out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from rampwatch.drivers.model.slo import ConversationsMet, Slo, Warmup, latency_from, read_warmup
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turns import TurnRecord, TurnRow

if TYPE_CHECKING:
    from rampwatch.drivers.model.analysis import SessionReport


class OpenLoop(msgspec.Struct):
    """An open-loop run (--arrivals): how conversations arrived and how late the client sent turns."""

    arrivals_per_min: float
    seed: int | None
    max_live: int | None
    arrived: int  # conversations that arrived (were planned)
    late_turns: int  # turns sent more than 10 ms after their due time
    send_lag_max_s: float | None
    ttft_from_due_p50_s: float | None
    ttft_from_send_p50_s: float | None
    warmup: str | None = None  # what --warmup left out of the turn figures, in words (None: nothing)


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


def warmup_of(state: RunState) -> Warmup | None:
    """The run's --warmup (None: none, or a hand-edited header's that no longer reads: nothing left out)."""
    return read_warmup(state.header.warmup if state.header is not None else None)


def steady(state: RunState, recs: list[TurnRecord], warm: Warmup | None) -> tuple[list[TurnRecord], float]:
    """The turns past the warmup and where the steady window starts: the warmup's end (for N arrivals: the first
    due turn left in of the whole run), else the run's start."""
    if warm is None:
        return recs, 0.0
    later = [latency_from(r) for r in state.turns if not warm.excludes(r)]
    start = warm.seconds if warm.seconds is not None else min(later, default=0.0)
    return [r for r in recs if not warm.excludes(r)], start


def steady_minutes(state: RunState, start: float) -> float:
    """The steady window's length in minutes: from `start` (steady's) to the run's last event."""
    return max(0.0, (state.ended.t if state.ended is not None else state.t) - start) / 60


def open_loop(state: RunState, ramp: list[str]) -> OpenLoop | None:
    """How conversations arrived (all of them) and how late the turns past --warmup were sent."""
    h = state.header
    if h is None or not h.arrivals_per_s:
        return None
    warm = warmup_of(state)
    recs, _ = steady(state, [r for r in state.turns if r.session in ramp], warm)
    lags = [r.send_lag for r in recs if r.send_lag is not None]
    return OpenLoop(
        arrivals_per_min=h.arrivals_per_s * 60,
        seed=h.seed,
        max_live=h.max_live,
        arrived=len(ramp),
        late_turns=sum(1 for r in recs if r.late),
        send_lag_max_s=max(lags, default=None),
        ttft_from_due_p50_s=median(
            [r.first_t - r.due_t for r in recs if r.first_t is not None and r.due_t is not None]
        ),
        ttft_from_send_p50_s=median([r.ttft for r in recs if r.ttft is not None and r.due_t is not None]),
        warmup=warm.text() if warm is not None else None,
    )


def goodput(state: RunState, slo: Slo, sessions: list[SessionReport]) -> Goodput:
    """Turns that met the SLO, and conversations that did (ConversationsMet), over the run's minutes; --warmup's
    turns (and a conversation with any turn in it) left out, and its time with them."""
    warm = warmup_of(state)
    keep: dict[str, list[TurnRow]] = {}
    met_conversations = ConversationsMet()
    left_out = 0
    for s in sessions:
        recs = [r for r in state.turns if r.session == s.id]
        for row, r in zip(s.turns, recs, strict=True):
            met_conversations.add(s.id, bool(row.slo_met), in_warmup=warm is not None and warm.excludes(r))
        if warm is not None and any(warm.excludes(r) for r in recs):
            left_out += sum(1 for r in recs if warm.excludes(r))
            kept = [row for row, r in zip(s.turns, recs, strict=True) if not warm.excludes(r)]
            if kept:
                keep[s.id + "~"] = kept  # a conversation begun in the warmup: its later turns count, it does not
            continue
        keep[s.id] = s.turns
    _, start = steady(state, [], warm)
    rows = [row for turns in keep.values() for row in turns]
    ran = [turns for sid, turns in keep.items() if turns and not sid.endswith("~")]  # never started: not one
    good_conv = len(met_conversations)
    minutes = steady_minutes(state, start)
    met = sum(1 for row in rows if row.slo_met)
    return Goodput(
        slo=slo.text,
        turns_met=met,
        turns=len(rows),
        conversations_met=good_conv,
        conversations=len(ran),
        minutes=minutes,
        turns_met_per_min=met / minutes if minutes > 0 else None,
        conversations_met_per_min=good_conv / minutes if minutes > 0 else None,
        warmup=warm.text() if warm is not None else None,
        warmup_turns=left_out,
    )
