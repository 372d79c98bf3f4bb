"""The report's figures of an open-loop run (--arrivals: how users arrived, the turns sent late) and of an
SLO (--slo: goodput, the turns and conversations that met it, --warmup left out)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from rampwatch.drivers.model.slo import Slo, latency_from, parse_warmup
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turns import TurnRow

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


def open_loop(state: RunState, ramp: list[str]) -> OpenLoop | None:
    h = state.header
    if h is None or not h.arrivals_per_s:
        return None
    recs = [r for r in state.turns if r.session in ramp]
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
    )


def goodput(state: RunState, slo: Slo, sessions: list[SessionReport]) -> Goodput:
    """Turns that met the SLO, and conversations every turn of which did, over the run's minutes; --warmup's
    turns (and a conversation with any turn in it) left out, and its time with them."""
    h = state.header
    try:
        warm = parse_warmup(h.warmup) if h is not None and h.warmup else None
    except ValueError:  # a hand-edited header's warmup that no longer reads: nothing left out
        warm = None
    keep: dict[str, list[TurnRow]] = {}
    left_out, start = 0, 0.0
    for s in sessions:
        recs = [r for r in state.turns if r.session == s.id]
        if warm is not None and any(warm.excludes(r) for r in recs):
            left_out += sum(1 for r in recs if warm.excludes(r))
            kept = [row for row, r in zip(s.turns, recs, strict=True) if not warm.excludes(r)]
            if kept:
                keep[s.id + "~"] = kept  # a conversation begun in the warmup: its later turns count, it does not
            continue
        keep[s.id] = s.turns
    if warm is not None:
        later = [latency_from(r) for r in state.turns if not warm.excludes(r)]
        start = warm.seconds if warm.seconds is not None else min(later, default=0.0)
    rows = [row for turns in keep.values() for row in turns]
    ran = [turns for sid, turns in keep.items() if turns and not sid.endswith("~")]  # never started: not one
    good_conv = sum(1 for turns in ran if all(row.slo_met for row in turns))
    minutes = max(0.0, (state.ended.t if state.ended else state.t) - start) / 60
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
