"""A sweep: the same ramp at several session counts, in lockstep, one
recording per point, and a small JSON file that lists them (which
`rampwatch compare` reads as its runs)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from rampwatch.drivers.model.state import RunState

SWEEP_TYPE = "rampwatch-sweep"


class SweepFile(msgspec.Struct, kw_only=True):
    type: str = SWEEP_TYPE
    schema: int = 1
    sessions: list[int]  # the points asked for
    runs: list[str]  # recordings of the points that ran, relative to this file
    stopped: str | None = None  # why the sweep ended before its last point


def write_sweep(path: Path, sweep: SweepFile) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(sweep)) + b"\n")


def read_sweep(path: Path) -> list[Path] | None:
    """The recordings a sweep file lists, or None when `path` is not a sweep file."""
    try:
        head = path.open("rb").read(1)
        if head != b"{":
            return None
        sweep = msgspec.json.decode(path.read_bytes(), type=SweepFile)
    except (OSError, msgspec.DecodeError):
        return None
    if sweep.type != SWEEP_TYPE:
        return None
    return [path.parent / run for run in sweep.runs]


def why_stop(state: RunState) -> str | None:
    """A point after which more sessions would only measure an overloaded server."""
    failed = sum(1 for r in state.turns if r.status == "failed")
    if failed:
        return f"{failed} turn(s) failed at {len(state.sessions)} sessions"
    preempted = state.preemptions_this_run()
    if preempted:
        return f"the server preempted {preempted:.0f} time(s) at {len(state.sessions)} sessions"
    if state.ended is not None and state.ended.status not in ("done", "failed"):
        return f"the run at {len(state.sessions)} sessions ended {state.ended.status}"
    return None
