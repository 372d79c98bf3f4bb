"""Per-turn rows, per-session summaries, interference: the numbers a report prints.

Pure functions of a RunState, which is itself a pure fold of the events, so a
live run, its replay and `rampwatch report` print the same figures.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from rampwatch.drivers.model.state import RunState, TurnRecord


class TurnRow(msgspec.Struct):
    turn: int
    context_tokens: int
    new_tokens: int
    cached_tokens: int | None
    ttft_s: float | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    output_tokens: int
    hit_rate: float | None
    kv_peak: float | None
    needle: bool | None
    error: str | None


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


def _delta(rec: TurnRecord, key: str) -> float | None:
    a, b = rec.counters_at_sent.get(key), rec.counters_at_done.get(key)
    return None if a is None or b is None else b - a


def turn_hit_rate(rec: TurnRecord) -> float | None:
    """The request's own cached share when the server reports it; else the
    server-wide prefix-cache hit rate over the turn (counter deltas)."""
    if rec.cached_tokens is not None and rec.prompt_tokens:
        return rec.cached_tokens / rec.prompt_tokens
    dq, dh = _delta(rec, "prefix_queries"), _delta(rec, "prefix_hits")
    if dq and dh is not None and dq > 0:
        return dh / dq
    return None


def turn_row(rec: TurnRecord, prev_prompt: int | None = None) -> TurnRow:
    prompt = rec.prompt_tokens
    context = prompt if prompt is not None else rec.target
    if prompt is not None and rec.cached_tokens is not None:
        new = prompt - rec.cached_tokens
    elif prompt is not None and prev_prompt is not None:
        new = prompt - prev_prompt
    elif prompt is not None and rec.turn == 1:
        new = prompt
    else:
        new = rec.new_tokens_est
    ttft = rec.ttft
    tokens = rec.completion_tokens or rec.chunks  # usage when reported, chunks otherwise
    decode = None
    if rec.first_t is not None and rec.last_t is not None and rec.last_t > rec.first_t and tokens > 1:
        decode = (tokens - 1) / (rec.last_t - rec.first_t)
    return TurnRow(
        turn=rec.turn,
        context_tokens=context,
        new_tokens=new,
        cached_tokens=rec.cached_tokens,
        ttft_s=ttft,
        prefill_tok_s=(new / ttft) if ttft and prompt is not None else None,
        decode_tok_s=decode,
        output_tokens=tokens,
        hit_rate=turn_hit_rate(rec),
        kv_peak=rec.kv_peak,
        needle=rec.needle,
        error=rec.error if rec.status != "ok" else None,
    )


def turn_line(rec: TurnRecord) -> str:
    """The one-line summary of a finished turn (headless output, events panel)."""
    row = turn_row(rec)
    parts = [f"{rec.session} turn {rec.turn}"]
    if row.ttft_s is not None:
        parts.append(f"TTFT {row.ttft_s:.2f}s")
    if row.decode_tok_s is not None:
        parts.append(f"decode {row.decode_tok_s:.1f} tok/s")
    if row.needle is not None:
        parts.append("needle ✓" if row.needle else "needle ✗")
    parts.append(f"ctx {row.context_tokens:,}")
    if row.cached_tokens is not None:
        parts.append(f"cached {row.cached_tokens:,}")
    return "  ".join(parts)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def session_rows(state: RunState, session: str) -> list[TurnRow]:
    rows: list[TurnRow] = []
    prev_prompt: int | None = None
    for rec in state.turns:
        if rec.session != session:
            continue
        rows.append(turn_row(rec, prev_prompt))
        if rec.prompt_tokens is not None:
            prev_prompt = rec.prompt_tokens
    return rows


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
    alone = [r.alone_n / r.alone_dt for r in state.turns if r.alone_n >= MIN_INTERVALS and r.alone_dt > 0]
    during = [r.during_n / r.during_dt for r in state.turns if r.during_n >= MIN_INTERVALS and r.during_dt > 0]
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
