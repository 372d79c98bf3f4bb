"""Per-turn rows, per-session summaries, interference: the numbers a report prints.

Pure functions of a RunState, which is itself a pure fold of the events, so a
live run, its replay and `rampwatch report` print the same figures.
"""

from __future__ import annotations

import statistics
import msgspec

from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turns import GapStats, TurnRecord, TurnRow, gap_stats, split_decode_rates, turn_row


REPORT_SCHEMA = 2  # the JSON report's schema (README: "The JSON schema"); bump on any change


class SessionSummary(msgspec.Struct):
    ttft_sum_s: float
    ttft_max_s: float
    decode_tok_s_median: float | None
    needle_found: int
    turns: int  # finished attempts (failed ones included)
    planned_turns: int
    reached_turn: int  # the last turn that finished ok (a time limit can stop a ramp early)
    gaps_alone: GapStats | None
    gaps_during_foreign_prefill: GapStats | None


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
    status: str | None  # how the run ended (done, failed, interrupted, crashed, time-limit); None: still running
    lockstep: bool
    needle_mode: str
    one_shot: bool
    time_limit_s: float | None


class Interference(msgspec.Struct):
    decode_tok_s_alone_median: float | None
    decode_tok_s_during_foreign_prefill_median: float | None
    overlapping_turns: int
    gaps_alone: GapStats | None
    gaps_during_foreign_prefill: GapStats | None


class TurnSpread(msgspec.Struct):
    """One turn across the ramp sessions: how much longer the slowest waited."""

    turn: int
    slowest_ttft_s: float
    fastest_ttft_s: float
    ratio: float


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


class Report(msgspec.Struct):
    run: RunInfo
    sessions: list[SessionReport]
    interference: Interference
    server: ServerSummary
    turn_spread: list[TurnSpread]  # per turn, with two or more ramp sessions
    ttft_ratio_median: float | None  # median of turn_spread's ratios
    one_shot: OneShot | None


MIN_INTERVALS = 3  # decode intervals a turn needs before its split rate counts


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def session_rows(state: RunState, session: str) -> list[TurnRow]:
    return [turn_row(rec) for rec in state.turns if rec.session == session]


def _summary(state: RunState, sid: str, rows: list[TurnRow], records: list[TurnRecord]) -> SessionSummary:
    ttfts = [r.ttft_s for r in rows if r.ttft_s is not None]
    return SessionSummary(
        ttft_sum_s=sum(ttfts),
        ttft_max_s=max(ttfts, default=0.0),
        decode_tok_s_median=_median([r.decode_tok_s for r in rows if r.decode_tok_s is not None]),
        needle_found=sum(1 for r in rows if r.needle),
        turns=len(rows),
        planned_turns=len(state.sessions[sid].schedule),
        reached_turn=max((r.turn for r in records if r.status == "ok"), default=0),
        gaps_alone=gap_stats([g for r in records for g in r.gaps_alone]),
        gaps_during_foreign_prefill=gap_stats([g for r in records for g in r.gaps_during]),
    )


def turn_spread(state: RunState, ramp: list[str]) -> list[TurnSpread]:
    """Per turn: the slowest and fastest ramp session's TTFT (turns every ramp session finished)."""
    by_turn: dict[int, list[float]] = {}
    for rec in state.turns:
        if rec.session in ramp and rec.status == "ok" and rec.ttft is not None:
            by_turn.setdefault(rec.turn, []).append(rec.ttft)
    out = []
    for turn, ttfts in sorted(by_turn.items()):
        if len(ttfts) >= 2 and len(ttfts) == len(ramp) and min(ttfts) > 0:
            out.append(TurnSpread(turn=turn, slowest_ttft_s=max(ttfts), fastest_ttft_s=min(ttfts), ratio=max(ttfts) / min(ttfts)))
    return out


def build_report(state: RunState) -> Report:
    h = state.header
    ramp = [sid for sid, s in state.sessions.items() if s.role == "ramp"]
    baseline = [sid for sid, s in state.sessions.items() if s.role == "one-shot"]
    sessions: list[SessionReport] = []
    for sid in ramp:
        records = [r for r in state.turns if r.session == sid]
        rows = [turn_row(r) for r in records]
        sessions.append(SessionReport(id=sid, turns=rows, summary=_summary(state, sid, rows, records)))
    ramp_turns = [r for r in state.turns if r.session in ramp]
    splits = [split_decode_rates(r, MIN_INTERVALS) for r in ramp_turns]
    spread = turn_spread(state, ramp)
    one_shot = None
    shot = next((r for r in state.turns if r.session in baseline and r.status == "ok"), None)
    if shot is not None and shot.ttft:
        one_shot = OneShot(turn=turn_row(shot), ramps=[
            RampVsOneShot(session=s.id, ramp_ttft_sum_s=s.summary.ttft_sum_s, ramp_ttft_max_s=s.summary.ttft_max_s,
                          sum_ratio=s.summary.ttft_sum_s / shot.ttft, longest_ratio=s.summary.ttft_max_s / shot.ttft)
            for s in sessions])
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
        ),
        sessions=sessions,
        interference=Interference(
            decode_tok_s_alone_median=_median([a for a, _ in splits if a is not None]),
            decode_tok_s_during_foreign_prefill_median=_median([d for _, d in splits if d is not None]),
            overlapping_turns=sum(1 for r in ramp_turns if r.gaps_during),
            gaps_alone=gap_stats([g for r in ramp_turns for g in r.gaps_alone]),
            gaps_during_foreign_prefill=gap_stats([g for r in ramp_turns for g in r.gaps_during]),
        ),
        server=ServerSummary(kv_peak=state.server.kv_peak, hit_rate_last_turn=state.last_turn_hit_rate()),
        turn_spread=spread,
        ttft_ratio_median=_median([s.ratio for s in spread]),
        one_shot=one_shot,
    )
