"""`rampwatch trace info` as text: a trace's figures (drivers/model/trace_stats.py), one topic a line."""

from __future__ import annotations

import math

from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.trace import REASONS
from rampwatch.drivers.model.trace_slice import SLICE_REASONS
from rampwatch.drivers.model.trace_stats import Spread, TraceInfo
from rampwatch.drivers.present.format import pct
from rampwatch.drivers.present.svg import clock_text

_MARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60  # the requests-per-minute line has at most this many marks


def render_trace_info(info: TraceInfo) -> str:
    lines = [
        f"trace       {info.path}: {info.format}, {info.block_size}-token blocks",
        f"sessions    {info.sessions:,} ({info.forked_sessions:,} forked), {counted(info.requests, 'request')}; "
        f"turns per session {_spread(info.turns_per_session, '')}",
        *_rate_lines(info),
        f"context     {_spread(info.context_tokens, ' tokens')}",
        f"growth      per turn {_spread(info.growth_per_turn, ' tokens')}",
        f"ideal hit   {_hit_rates(info)}",
        f"peak live   {_peak(info)}",
    ]
    skipped = _skipped(info)
    if skipped:
        lines.append(f"skipped     {skipped}")
    return "\n".join(lines) + "\n"


def _spread(s: Spread | None, unit: str) -> str:
    if s is None:
        return "none"
    p99 = "" if s.p99 is None else f"  p99 {s.p99:,.0f}"
    return f"p50 {s.p50:,.0f}{p99}  max {s.max:,.0f}{unit}"


def _rate_lines(info: TraceInfo) -> list[str]:
    per_minute = info.requests_per_minute
    if not per_minute:
        return ["time        no requests"]
    peak = max(per_minute)
    mean = sum(per_minute) / len(per_minute)
    head = (
        f"time        {clock_text(info.span_s)} span; requests per minute mean {mean:,.1f}, "
        f"peak {peak:,} (minute {per_minute.index(peak) + 1})"
    )
    marks, minutes = sparkline(per_minute)
    return [head, f"            {marks}  (a mark is {minutes} min)"]


def sparkline(per_minute: list[int], width: int = SPARK_WIDTH) -> tuple[str, int]:
    """The requests per minute as at most `width` marks (each the mean of its minutes), and minutes a mark."""
    minutes = max(1, math.ceil(len(per_minute) / width))
    means = [
        sum(chunk) / len(chunk) for chunk in (per_minute[i : i + minutes] for i in range(0, len(per_minute), minutes))
    ]
    top = max(means) or 1.0
    return "".join(_MARKS[min(len(_MARKS) - 1, int(m / top * (len(_MARKS) - 1) + 0.5))] for m in means), minutes


def _hit_rates(info: TraceInfo) -> str:
    text = f"{pct(info.ideal_hit_rate)} unbounded ({info.ideal_cached:,} of {info.prompt_tokens:,} prompt tokens)"
    if info.kv_tokens is not None:
        text += f"; {pct(info.ideal_hit_rate_pool)} in an LRU pool of {info.kv_tokens:,} KV tokens"
    return text


def _peak(info: TraceInfo) -> str:
    if info.peak_live_at_s is None:
        return "none"
    return (
        f"{info.peak_live_tokens:,} tokens in {counted(info.peak_live_sessions, 'session')}, at "
        f"{clock_text(info.peak_live_at_s)}"
    )


def _skipped(info: TraceInfo) -> str:
    """Bad rows (--skip-bad) count rows (a line of a conversation format is one); the slice counts requests."""
    parts = []
    for reason, n in info.skipped.items():
        if reason in SLICE_REASONS:
            parts.append(f"{counted(n, 'request')} {SLICE_REASONS[reason]}")
        else:
            parts.append(f"{counted(n, 'row')} {REASONS.get(reason, reason)}")
    if info.stopped_at_duration:
        parts.append("nothing read after --duration")
    return "; ".join(parts)
