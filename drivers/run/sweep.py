"""A sweep: the same ramp at several session counts in lockstep (closed loop), or at several arrival rates
(open loop, --arrivals; --find-max searches for the knee), or a trace at several speeds (--trace), one recording
per point, and a small JSON file that lists them (which `rampwatch compare` reads as its runs, and `export` draws
as a capacity curve)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from rampwatch.drivers.model.capacity import overload
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.state import RunState

SWEEP_TYPE = "rampwatch-sweep"


SWEEP_SCHEMA = 3  # 2 added the open-loop fields below (a schema-1 file reads as a closed-loop sweep); 3 trace_speeds


class SweepFile(msgspec.Struct, kw_only=True):
    type: str = SWEEP_TYPE
    schema: int = SWEEP_SCHEMA
    sessions: list[int] = []  # closed loop: the session counts asked for
    runs: list[str]  # recordings of the points that ran, relative to this file
    stopped: str | None = None  # why the sweep ended before its last point
    arrivals_per_min: list[float] = []  # open loop: the rates of the points, in the order they ran
    seed: int | None = None  # open loop: every point's arrivals are drawn from this seed
    slo: str | None = None  # --find-max: the SLO each point was judged by
    slo_share: float | None = None  # the share of turns that had to meet it
    knee_per_min: float | None = None  # the highest rate that kept the share (None: none did)
    knee_fail_per_min: float | None = None  # the lowest rate above it that did not (None: every rate tried kept it)
    trace_speeds: list[float] = []  # --trace: the speeds of the points, in the order they ran


def write_sweep(path: Path, sweep: SweepFile) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(sweep)) + b"\n")


def read_sweep_file(path: Path) -> SweepFile | None:
    """The sweep file at `path`, or None when it is not one."""
    try:
        with path.open("rb") as f:
            if f.read(1) != b"{":
                return None
        sweep = msgspec.json.decode(path.read_bytes(), type=SweepFile)
    except (OSError, msgspec.DecodeError):
        return None
    return sweep if sweep.type == SWEEP_TYPE else None


def read_sweep(path: Path) -> list[Path] | None:
    """The recordings a sweep file lists, or None when `path` is not a sweep file."""
    sweep = read_sweep_file(path)
    return None if sweep is None else [path.parent / run for run in sweep.runs]


def why_stop(state: RunState) -> str | None:
    """A point after which more sessions would only measure an overloaded server."""
    if reason := overload(state):
        return f"{reason} at {counted(len(state.sessions), 'session')}"
    if state.ended is not None and state.ended.status not in ("done", "failed"):
        return f"the run at {counted(len(state.sessions), 'session')} ended {state.ended.status}"
    return None
