"""--trace: how much of the prefix-cache reuse the trace allowed the server delivered, per session, per endpoint
and over the run, and the turns that fell furthest short: the first place to look for eviction, or a router that
moved a session. Read off the fold's turns (turns.py's ideal and reused tokens), like every report figure."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turns import TurnRecord, hit_rate, ideal_hit_rate, reused_tokens

SHORTFALLS_LISTED = 10


class ReuseTally(msgspec.Struct):
    """Measured cached tokens against the ideal, over a set of turns (those whose ideal is known)."""

    name: str  # a session, an endpoint, or "run"
    cached_tokens: int
    ideal_tokens: int
    ideal_pool_tokens: int | None  # None: no --trace-kv-tokens
    efficiency: float | None  # cached / ideal (None: nothing to reuse)
    efficiency_pool: float | None


class Shortfall(msgspec.Struct):
    """A turn whose measured reuse fell below its ideal."""

    session: str
    turn: int
    cached_tokens: int
    ideal_tokens: int
    hit_rate: float | None
    ideal_hit_rate: float | None


class Reuse(msgspec.Struct):
    run: ReuseTally
    sessions: list[ReuseTally]
    endpoints: list[ReuseTally]  # where the run had more than one
    shortfalls: list[Shortfall]  # the turns furthest below their ideal, worst first


def _tally(name: str, recs: list[TurnRecord]) -> ReuseTally:
    cached = sum(reused_tokens(r) or 0 for r in recs)
    ideal = sum(r.ideal_cached or 0 for r in recs)
    pools = [r.ideal_cached_pool for r in recs if r.ideal_cached_pool is not None]
    pool = sum(pools) if pools else None
    return ReuseTally(
        name=name,
        cached_tokens=cached,
        ideal_tokens=ideal,
        ideal_pool_tokens=pool,
        efficiency=cached / ideal if ideal else None,
        efficiency_pool=cached / pool if pool else None,
    )


def reuse(state: RunState) -> Reuse | None:
    """The run's reuse against its trace's ideal; None for a run that replayed no trace, or whose server never
    said what it had cached."""
    # A turn whose server reported no cached tokens says nothing of its reuse: left out, never counted as 0.
    recs = [r for r in state.turns if r.status == "ok" and r.ideal_cached is not None and r.cached_tokens is not None]
    if not recs:
        return None
    by_session: dict[str, list[TurnRecord]] = {}
    by_endpoint: dict[str, list[TurnRecord]] = {}
    for r in recs:
        by_session.setdefault(r.session, []).append(r)
        view = state.sessions.get(r.session)
        by_endpoint.setdefault(view.endpoint if view is not None else "", []).append(r)
    short = sorted(
        (r for r in recs if (reused_tokens(r) or 0) < (r.ideal_cached or 0)),
        key=lambda r: (reused_tokens(r) or 0) - (r.ideal_cached or 0),
    )
    return Reuse(
        run=_tally("run", recs),
        sessions=[_tally(sid, turns) for sid, turns in by_session.items()],
        endpoints=[_tally(name, turns) for name, turns in by_endpoint.items()] if len(by_endpoint) > 1 else [],
        shortfalls=[
            Shortfall(
                session=r.session,
                turn=r.turn,
                cached_tokens=reused_tokens(r) or 0,
                ideal_tokens=r.ideal_cached or 0,
                hit_rate=hit_rate(r),
                ideal_hit_rate=ideal_hit_rate(r),
            )
            for r in short[:SHORTFALLS_LISTED]
        ],
    )
