"""A slice of a long trace: from a start, for a duration, the first N sessions to start, requests up to a
context size. What the slice leaves out is counted by reason, never dropped silently; what it keeps is
renumbered so every session's turns run 1, 2, 3... and due times count from the slice's start."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Protocol

import msgspec

from rampwatch.drivers.model.trace import TraceRequest


class SliceSettings(Protocol):
    """Whatever names a slice's four settings as the slice does: a run's TraceOptions, a recording's TraceRun."""

    start_s: float
    duration_s: float | None
    sessions: int | None
    max_context: int | None


class TraceSlice(msgspec.Struct, frozen=True, kw_only=True):
    start_s: float = 0.0  # requests due before this are left out; the slice's times count from here
    duration_s: float | None = None  # requests due this long after the start or later are left out
    sessions: int | None = None  # only the first N sessions to start (in the slice) are kept
    max_context: int | None = None  # requests with a longer prompt are left out

    @classmethod
    def of(cls, settings: SliceSettings) -> TraceSlice:
        return cls(
            start_s=settings.start_s,
            duration_s=settings.duration_s,
            sessions=settings.sessions,
            max_context=settings.max_context,
        )

    @property
    def cuts(self) -> bool:
        return bool(self.start_s) or any(v is not None for v in (self.duration_s, self.sessions, self.max_context))


# The skip counts' keys, and the words that finish "skipped: N requests ...".
SLICE_REASONS = {
    "before-start": "due before --start",
    "over-max-context": "longer than --max-context",
    "past-sessions": "of sessions past --sessions",
}


class _Kept:
    """A session the slice keeps: its first kept turn's number in the trace, and the trace's turns it left out
    after that (rare: a turn over --max-context), to map the trace's numbering to the slice's."""

    __slots__ = ("first", "kept", "left_out")

    def __init__(self, first: int):
        self.first, self.kept, self.left_out = first, 0, []

    def slice_turn(self, trace_turn: int) -> int:
        """The slice's number of the last kept turn at or before the trace's turn `trace_turn` (0: none)."""
        if trace_turn < self.first:
            return 0
        return trace_turn - self.first + 1 - bisect.bisect_right(self.left_out, trace_turn)


class SliceCounts:
    """What a slice left out, by reason; `ended` once the duration was reached (nothing after it is read)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.ended = False

    def count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1


def slice_requests(
    requests: Iterable[TraceRequest], cut: TraceSlice, counts: SliceCounts | None = None
) -> Iterator[TraceRequest]:
    """The requests of `cut` (in due order, as they came), renumbered; a fork whose parent the slice left out
    becomes a session of its own."""
    counts = counts or SliceCounts()
    if not cut.cuts:
        yield from requests
        return
    end = None if cut.duration_s is None else cut.start_s + cut.duration_s
    kept: dict[str, _Kept] = {}
    for r in requests:
        if r.due_s < cut.start_s:
            counts.count("before-start")
            continue
        if end is not None and r.due_s >= end:
            counts.ended = True
            return
        session = kept.get(r.session)
        if cut.max_context is not None and r.input_length > cut.max_context:
            counts.count("over-max-context")
            if session is not None:
                session.left_out.append(r.turn)
            continue
        if session is None:
            # Once N sessions are kept, every other session's turns stay out, whenever they come.
            if cut.sessions is not None and len(kept) >= cut.sessions:
                counts.count("past-sessions")
                continue
            session = kept[r.session] = _Kept(r.turn)
            r.forked_from, r.fork_turn = _fork_in_slice(r, kept)
        session.kept += 1
        r.turn = session.kept
        r.due_s -= cut.start_s
        yield r


def _fork_in_slice(first: TraceRequest, kept: dict[str, _Kept]) -> tuple[str | None, int]:
    if first.forked_from is None or first.turn != 1:
        return None, 0
    parent = kept.get(first.forked_from)
    turn = parent.slice_turn(first.fork_turn) if parent is not None else 0
    return (first.forked_from, turn) if turn > 0 else (None, 0)
