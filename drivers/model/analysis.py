"""Per-turn rows, per-session summaries, interference: the numbers a report prints.

Pure functions of a RunState, which is itself a pure fold of the events, so a
live run, its replay and `rampwatch report` print the same figures.
"""

from __future__ import annotations

import statistics
import msgspec

from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turns import TurnRow, split_decode_rates, turn_row


class SessionSummary(msgspec.Struct):
    ttft_sum_s: float
    ttft_max_s: float
    decode_tok_s_median: float | None
    needle_found: int
    turns: int


class SessionReport(msgspec.Struct):
    id: str
    turns: list[TurnRow]
    summary: SessionSummary


class RunInfo(msgspec.Struct):
    schema: int
    rampwatch_version: str
    server: str
    model: str
    engine: str
    started_at: str
    sessions: int


class Interference(msgspec.Struct):
    decode_tok_s_alone_median: float | None
    decode_tok_s_during_foreign_prefill_median: float | None
    overlapping_turns: int


class ServerSummary(msgspec.Struct):
    kv_peak: float | None
    hit_rate_last_turn: float | None


class Report(msgspec.Struct):
    run: RunInfo
    sessions: list[SessionReport]
    interference: Interference
    server: ServerSummary


MIN_INTERVALS = 3  # decode intervals a turn needs before its split rate counts


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def session_rows(state: RunState, session: str) -> list[TurnRow]:
    return [turn_row(rec) for rec in state.turns if rec.session == session]


def build_report(state: RunState) -> Report:
    h = state.header
    sessions: list[SessionReport] = []
    for sid in state.sessions:
        rows = session_rows(state, sid)
        ttfts = [r.ttft_s for r in rows if r.ttft_s is not None]
        summary = SessionSummary(
            ttft_sum_s=sum(ttfts),
            ttft_max_s=max(ttfts, default=0.0),
            decode_tok_s_median=_median([r.decode_tok_s for r in rows if r.decode_tok_s is not None]),
            needle_found=sum(1 for r in rows if r.needle),
            turns=len(rows),
        )
        sessions.append(SessionReport(id=sid, turns=rows, summary=summary))
    splits = [split_decode_rates(r, MIN_INTERVALS) for r in state.turns]
    alone = [a for a, _ in splits if a is not None]
    during = [d for _, d in splits if d is not None]
    overlapping = sum(1 for r in state.turns if r.during_n > 0)
    last_hit = state.last_turn_hit_rate()
    return Report(
        run=RunInfo(
            schema=1,
            rampwatch_version=h.rampwatch_version if h else "",
            server=h.server if h else "",
            model=(h.model or "") if h else "",
            engine=(h.engine or state.server.engine or "") if h else (state.server.engine or ""),
            started_at=h.started_at if h else "",
            sessions=len(state.sessions),
        ),
        sessions=sessions,
        interference=Interference(
            decode_tok_s_alone_median=_median(alone),
            decode_tok_s_during_foreign_prefill_median=_median(during),
            overlapping_turns=overlapping,
        ),
        server=ServerSummary(kv_peak=state.server.kv_peak, hit_rate_last_turn=last_hit),
    )
