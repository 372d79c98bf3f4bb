"""Inter-token gaps: what counts as a wait between deliveries, their statistics, and the decode rates they give
alone and while another session prefilled. The report, the panels and the exporter all count by these rules."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable
from itertools import chain
from operator import sub

import msgspec

from rampwatch.drivers.model.stats import quantile
from rampwatch.drivers.model.turns import TurnRecord

STALL_S = 0.1  # a gap longer than this is a stall worth showing live
LONG_STALL_S = 1.0


class GapStats(msgspec.Struct):
    """Inter-token gaps: the waits between deliveries of generated text, as a
    reader of the stream saw them (not engine steps). A chunk can carry
    several tokens, and chunks that arrive in one network read share a
    stamp: they are one delivery, so their zero gaps are not counted here
    (the decode rates still count every chunk)."""

    count: int
    p50_s: float
    p99_s: float
    max_s: float
    over_100ms: int
    over_1s: int


# Whether a gap between two text chunks' stamps was a wait (dt > 0): chunks stamped in one network read (a zero
# gap) are one delivery. A C method, not a def: the statistics filter a long turn's 100,000s of gaps with it.
is_delivery_gap: Callable[[float], bool] = (0.0).__lt__


def gap_stats(gaps: Iterable[float]) -> GapStats | None:
    ordered = sorted(filter(is_delivery_gap, gaps))
    if not ordered:
        return None
    return GapStats(
        count=len(ordered),
        p50_s=quantile(ordered, 0.5),
        p99_s=quantile(ordered, 0.99),
        max_s=ordered[-1],
        over_100ms=len(ordered) - bisect_right(ordered, STALL_S),
        over_1s=len(ordered) - bisect_right(ordered, LONG_STALL_S),
    )


def add_gaps(rec: TurnRecord, times: list[float], foreign: list[tuple[float, float | None]]) -> None:
    """Fold a batch of text chunks' arrival times into the turn's gaps: each gap counts as during another
    session's prefill when its chunk arrived inside one of the `foreign` prefill spans (end None: in flight).
    The spans are merged into disjoint intervals and the batch's times (in arrival order) swept past them once:
    hundreds of sessions prefilling at once made a check of every span for every chunk the fold's largest cost."""
    during = _union(foreign)
    prev = rec.last_t
    if not during:  # the usual case, no other session prefilling: the batch's gaps at C speed
        gaps = array("d", map(sub, times, chain((prev,), times)) if prev is not None else map(sub, times[1:], times))
        if gaps:
            rec.gaps_alone.extend(gaps)
            rec.max_gap = max(rec.max_gap, max(gaps))
        rec.last_t = times[-1] if times else prev
        return
    i, n = 0, len(during)
    for t in times:
        if prev is not None:
            dt = t - prev
            while i < n and during[i][1] <= t:
                i += 1
            if i < n and during[i][0] <= t:
                rec.gaps_during.append(dt)
            else:
                rec.gaps_alone.append(dt)
            if dt > rec.max_gap:
                rec.max_gap = dt
        prev = t
    rec.last_t = prev


def _union(spans: list[tuple[float, float | None]]) -> list[tuple[float, float]]:
    """The half-open spans [start, end) (end None: still open) as disjoint intervals, in order."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted((a, math.inf if b is None else b) for a, b in spans):
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def turn_gaps(rec: TurnRecord) -> GapStats | None:
    """One turn's delivery gaps, alone and during another session's prefill together."""
    return gap_stats(rec.gaps_alone + rec.gaps_during)


def split_decode_rates(rec: TurnRecord, min_intervals: int) -> tuple[float | None, float | None]:
    """(decode tok/s alone, during another session's prefill) for one turn, in
    tokens (chunk intervals scaled by the turn's tokens per chunk)."""
    scale = rec.tokens_per_chunk

    def rate(gaps: array[float]) -> float | None:
        dt = sum(gaps)
        return len(gaps) * scale / dt if len(gaps) >= min_intervals and dt > 0 else None

    return rate(rec.gaps_alone), rate(rec.gaps_during)
