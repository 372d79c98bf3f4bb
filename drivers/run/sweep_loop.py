"""Running a sweep: the ramp at each session count in turn, in lockstep, each point recorded beside the
sweep file, stopping at the first point where the server fails or preempts (more would only measure
overload). Kept apart from sweep.py, which `compare` reads without loading the run machinery."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rampwatch.drivers.model.analysis import Report, build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED
from rampwatch.drivers.run.headless import LinePrinter, run_headless
from rampwatch.drivers.run.sweep import SweepFile, why_stop, write_sweep

EXIT_INTERRUPTED = (129, 130, 143)  # SIGHUP, Ctrl-C, SIGTERM


@dataclass
class SweepResult:
    sweep: SweepFile
    points: list[tuple[int, Report, float | None]] = field(default_factory=list)  # sessions, report, preemptions
    exit_code: int = 0


def point_path(sweep_path: Path, sessions: int) -> Path:
    """Where the point at `sessions` sessions records: beside the sweep file, named after it."""
    return sweep_path.with_name(f"{sweep_path.name.removesuffix('.sweep.json')}-{sessions}s.jsonl")


def run_sweep(
    cfg: RunConfig,
    counts: list[int],
    sweep_path: Path | None,
    printer_for: Callable[[RunState], LinePrinter],
    final_report: Callable[[RunState], str],
) -> SweepResult:
    """Each point headless, from `cfg` with its session count (its lines from `printer_for`, its table from
    `final_report`); the sweep file is rewritten after every point, so a sweep cut short still lists what ran."""
    result = SweepResult(SweepFile(sessions=counts, runs=[]))
    sweep = result.sweep
    for n in counts:
        point = replace(
            cfg, sessions=n, lockstep=True, record=point_path(sweep_path, n) if sweep_path is not None else cfg.record
        )
        print(f"rampwatch sweep: {n} session(s)", flush=True)
        run, serving = run_headless(
            point, record=sweep_path is not None, printer_for=printer_for, final_report=final_report
        )
        serving.close()  # the next point serves on the same port
        assert run.state is not None
        result.points.append((n, build_report(run.state), run.state.preemptions_this_run()))
        if sweep_path is not None and run.recording_path is not None:
            sweep.runs.append(run.recording_path.name)
            write_sweep(sweep_path, sweep)
        if run.exit_code in (*EXIT_INTERRUPTED, EXIT_CRASHED):
            result.exit_code = run.exit_code
            return result
        sweep.stopped = why_stop(run.state)
        if sweep.stopped:
            print(f"rampwatch sweep: stopped: {sweep.stopped}", flush=True)
            break
    if sweep_path is not None:
        write_sweep(sweep_path, sweep)
    result.exit_code = 1 if sweep.stopped and "failed" in sweep.stopped else 0
    return result
