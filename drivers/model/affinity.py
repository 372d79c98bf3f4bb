"""Did each session stay on its backend? Affinity and moves, read off the turns' `served_by` (backends.py).

A session's affinity is the share of its turns with a known backend that its first backend served; a move is a
turn served by another backend than the turn before it (turns whose backend is unknown or ambiguous are skipped),
with the hit rate of the turn before and of the turn that moved: a move that explains a falling hit rate shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import msgspec

from rampwatch.drivers.model.turns import TurnRecord, hit_rate

T = TypeVar("T")


class Move(msgspec.Struct):
    turn: int  # the turn served elsewhere
    from_backend: str
    to_backend: str
    hit_before: float | None  # the hit rate of the turn before it (its previous known backend's)
    hit_after: float | None  # ... and of the turn that moved


class Affinity(msgspec.Struct):
    """One session's stay on its backend (the report's per-session `affinity`)."""

    first_backend: str | None  # None: every turn's backend was ambiguous
    served_turns: int  # turns that finished ok with a known backend
    held_turns: int  # ... of them served by the first backend
    share: float | None  # held / served (None: none served with a known backend)
    ambiguous_turns: int  # turns the counters could not tell apart (overlapping turns)
    moves: list[Move]


class RunAffinity(msgspec.Struct):
    """Every session together: the report summary's "4 sessions, affinity 100%"."""

    sessions: int  # sessions with a known (or ambiguous) backend on some turn
    served_turns: int
    held_turns: int
    share: float | None
    moved_sessions: int
    moves: int
    ambiguous_turns: int


def _served(records: Iterable[TurnRecord]) -> list[TurnRecord]:
    """The turns that finished ok, the last attempt of each, in turn order."""
    last: dict[int, TurnRecord] = {}
    for r in records:
        if r.status == "ok":
            last[r.turn] = r
    return [last[t] for t in sorted(last)]


def session_affinity(records: Iterable[TurnRecord]) -> Affinity | None:
    """A session's affinity from its turns; None when no turn's backend was told (one server, or no source)."""
    turns = _served(records)
    known = [r for r in turns if r.served_by is not None]
    ambiguous = sum(1 for r in turns if r.served_by_source == "ambiguous")
    if not known:
        return Affinity(None, 0, 0, None, ambiguous, []) if ambiguous else None
    first = known[0].served_by
    moves = [
        Move(b.turn, a.served_by or "", b.served_by or "", hit_rate(a), hit_rate(b))
        for a, b in _changes(known, lambda r: r.served_by)
    ]
    held = sum(1 for r in known if r.served_by == first)
    return Affinity(first, len(known), held, held / len(known), ambiguous, moves)


def run_affinity(sessions: Iterable[Affinity | None]) -> RunAffinity | None:
    known = [a for a in sessions if a is not None]
    if not known:
        return None
    served, held = sum(a.served_turns for a in known), sum(a.held_turns for a in known)
    return RunAffinity(
        sessions=len(known),
        served_turns=served,
        held_turns=held,
        share=held / served if served else None,
        moved_sessions=sum(1 for a in known if a.moves),
        moves=sum(len(a.moves) for a in known),
        ambiguous_turns=sum(a.ambiguous_turns for a in known),
    )


def moves_of(backends: dict[int, str]) -> int:
    """Moves in a session's backends by turn (the Sessions panel's mark, kept by the fold as backends arrive)."""
    return len(_changes([backends[t] for t in sorted(backends)], lambda b: b))


def _changes(seq: list[T], backend: Callable[[T], str | None]) -> list[tuple[T, T]]:
    """The one definition of a move: consecutive known backends that differ, as (before, after)."""
    return [(a, b) for a, b in zip(seq, seq[1:], strict=False) if backend(a) != backend(b)]
