"""Behind a router, in words: whether each session stayed on its backend (its moves, with the hit rate before
and after), and the router's own requests per worker. Lines under a report's tables (summary.py)."""

from __future__ import annotations

from rampwatch.drivers.model.affinity import Affinity
from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.present.format import pct

MOVES_SHOWN = 4  # a session's moves listed in its line; the rest counted (round robin moves every turn)
SESSIONS_SHOWN = 16  # moved sessions given a line each; the rest counted
_TIMES = {1: "once", 2: "twice"}


def moves_text(sid: str, a: Affinity) -> str:
    """`s3 moved twice: turn 7 r0→r1, hit 95%→4%; ...`"""
    times = _TIMES.get(len(a.moves), f"{len(a.moves)} times")
    shown = [
        f"turn {m.turn} {m.from_backend}→{m.to_backend}, hit {pct(m.hit_before)}→{pct(m.hit_after)}" for m in a.moves
    ]
    more = f"; {len(shown) - MOVES_SHOWN} more" if len(shown) > MOVES_SHOWN else ""
    return f"{sid} moved {times}: " + "; ".join(shown[:MOVES_SHOWN]) + more


def affinity_lines(rep: Report) -> list[str]:
    """The run's affinity, then each session that moved (none where no turn's backend was told)."""
    run = rep.affinity
    if run is None:
        return []
    sessions = counted(run.sessions, "session")
    line = f"{sessions}, affinity {pct(run.share)} ({run.held_turns}/{run.served_turns} turns on the first backend)"
    if not run.served_turns:
        line = f"{sessions}: no turn's backend told apart"
    if run.ambiguous_turns:
        line += (
            f"; {counted(run.ambiguous_turns, 'turn')} ambiguous (overlapping turns moved several backends' counters)"
        )
    lines = [line]
    moved = [(s.id, s.affinity) for s in rep.sessions if s.affinity is not None and s.affinity.moves]
    lines += [moves_text(sid, a) for sid, a in moved[:SESSIONS_SHOWN]]
    if len(moved) > SESSIONS_SHOWN:
        lines.append(f"{len(moved) - SESSIONS_SHOWN} more sessions moved")
    return lines


def move_note(rep: Report, session: str, turn: int) -> str:
    """` (moved r0→r1)` where the session's turn was served elsewhere than its turn before: a move explains a
    cache that held less than the trace allowed ("" otherwise)."""
    s = next((x for x in rep.sessions if x.id == session), None)
    moves = s.affinity.moves if s is not None and s.affinity is not None else []
    m = next((m for m in moves if m.turn == turn), None)
    return f" (moved {m.from_backend}→{m.to_backend})" if m is not None else ""


def router_lines(rep: Report) -> list[str]:
    """Each router endpoint's requests per worker since it first answered, and what it retried or failed (where
    it counts them: a router creates those series with the first retry or error)."""
    lines = []
    for f in rep.servers:
        if f.workers is None:
            continue
        line = f"router {f.name}: " + (" · ".join(f"{w} {n:,.0f}" for w, n in f.workers.items()) or "no worker")
        line += " requests"
        for n, what in ((f.router_retries, "retried"), (f.router_errors, "failed")):
            line += f", {n:,.0f} {what}" if n else ""
        lines.append(line)
    return lines
