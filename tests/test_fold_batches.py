"""The fold takes a batch of token stamps a bucket and a gap list at a time (C-speed steps, not a Python step a
chunk): it must count exactly what a chunk-at-a-time fold counts, across bucket edges, the decode window and the
timeline's trimming, with and without another session's prefill overlapping."""

from __future__ import annotations

import random

import pytest

from rampwatch.drivers.model.gaps import add_gaps
from rampwatch.drivers.model.turns import TurnRecord
from rampwatch.drivers.model.views import DECODE_WINDOW_S, TIMELINE_BUCKET_S, TIMELINE_LEN, SessionView


def _batches(seed: int, seconds: float) -> list[list[float]]:
    """Sorted stamps from t=3.7 s on, in reads of one to a few thousand chunks sharing a stamp (a fast stream),
    batched as the streamer flushes them (a few reads a batch), with pauses that skip whole buckets."""
    rng, t, out = random.Random(seed), 3.7, []
    while t < seconds:
        batch: list[float] = []
        for _ in range(rng.randint(1, 6)):
            t += rng.choice([0.0, 0.0004, 0.03, 0.3, 2.5])
            batch += [t] * rng.choice([1, 1, 3, 2048])
        out.append(batch)
    return out


def _by_chunk(batches: list[list[float]]) -> tuple[list[int], int, int, float, float, list[float], float]:
    """What the fold held when it went a chunk at a time: timeline, its first bucket, the decode window's count,
    first and last, the gaps, and the largest."""
    counts: list[int] = []
    first, recent, gaps, prev, top = 0, [], [], None, 0.0
    for times in batches:
        for t in times:
            b = int(t // TIMELINE_BUCKET_S)
            if not counts:
                first = b
            i = b - first
            if i >= len(counts):
                counts.extend([0] * (i + 1 - len(counts)))
            if i >= 0:
                counts[i] += 1
            if prev is not None:
                gaps.append(t - prev)
                top = max(top, t - prev)
            prev = t
        if len(counts) > 2 * TIMELINE_LEN:
            drop = len(counts) - TIMELINE_LEN
            del counts[:drop]
            first += drop
        recent = [t for t in recent + times if t >= times[-1] - DECODE_WINDOW_S]
    return counts, first, len(recent), recent[0], recent[-1], gaps, top


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_folds_as_its_chunks_one_at_a_time(seed):
    batches = _batches(seed, 4000.0 if seed == 0 else 60.0)  # seed 0 runs past the timeline's trimming
    view, rec = (
        SessionView(id="s1", schedule=[100]),
        TurnRecord(session="s1", turn=1, target=1, new_tokens_est=1, sent_t=0.0),
    )
    for times in batches:
        view.chunks_arrived(times)
        add_gaps(rec, times, [])
    counts, first, n, lo, hi, gaps, top = _by_chunk(batches)
    assert (view.timeline, view.timeline_first) == (counts, first)
    assert (len(view.recent), view.recent.first, view.recent.last) == (n, lo, hi)
    assert list(rec.gaps_alone) == gaps and not rec.gaps_during and rec.max_gap == top


def test_gaps_during_a_foreign_prefill_go_a_chunk_at_a_time_as_before():
    rec = TurnRecord(session="s1", turn=1, target=1, new_tokens_est=1, sent_t=0.0)
    add_gaps(rec, [1.0, 1.5], [])
    add_gaps(rec, [2.0, 2.2, 3.0], [(1.9, 2.5)])  # 2.0 and 2.2 arrive inside it
    assert [round(g, 9) for g in rec.gaps_alone] == [0.5, 0.8] and [round(g, 9) for g in rec.gaps_during] == [0.5, 0.2]
    assert round(rec.max_gap, 9) == 0.8 and rec.last_t == 3.0
