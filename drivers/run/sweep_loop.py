"""Running a sweep, one headless point after another, each recorded beside the sweep file, which is rewritten
after every point (a sweep cut short still lists what ran):
- closed loop (--sessions 1,2,4): the ramp at each session count in lockstep, stopping at the first point
  where the server fails or preempts (more would only measure overload);
- open loop (--arrivals RATES): conversations arriving at each rate for --time-limit, a point ending early
  once the server saturates, the sweep with it;
- the knee (--find-max): open-loop points at the rates a KneeSearch picks, each judged by its goodput share;
- a trace (--trace, --trace-speed 0.5,1,2): the trace replayed at each speed, the capacity curve of the user's
  own traffic, ending early once the server saturates, the sweep with it.
Kept apart from sweep.py, which `compare` and `export` read without loading the run machinery."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.analysis import Report, build_report
from rampwatch.drivers.model.capacity import CapacityPoint, capacity_point, kept_share, saturation
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED
from rampwatch.drivers.run.headless import LinePrinter, run_headless
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.run.sweep import SweepFile, why_stop, write_sweep
from rampwatch.drivers.run.sweep_plan import OpenLoopPlan

EXIT_INTERRUPTED = (129, 130, 143)  # SIGHUP, Ctrl-C, SIGTERM


@dataclass
class SweepResult:
    sweep: SweepFile
    points: list[tuple[int, Report, float | None]] = field(default_factory=list)  # closed: sessions, report, preempted
    capacity: list[CapacityPoint] = field(default_factory=list)  # open loop, in the order the points ran
    exit_code: int = 0


def point_path(sweep_path: Path, label: str) -> Path:
    """Where a point (labelled '4s': 4 sessions, '2.5pm': 2.5 arrivals a minute) records: beside the sweep file."""
    return sweep_path.with_name(f"{sweep_path.name.removesuffix('.sweep.json')}-{label}.jsonl")


def rate_label(per_s: float) -> str:
    return f"{per_s * 60:.4g}pm"


@dataclass
class _Points:
    """Runs the points of one sweep, keeping its file current."""

    sweep_path: Path | None
    printer_for: Callable[[RunState], LinePrinter]
    final_report: Callable[[RunState], str]
    result: SweepResult
    any_failed: bool = False  # a point had a failed turn (an attempt, retried or not) or lost a worker: exit 1

    def run(self, cfg: RunConfig, label: str, stop_when: Callable[[RunState], str | None] | None = None) -> Run:
        path = point_path(self.sweep_path, label) if self.sweep_path is not None else cfg.record
        run, serving = run_headless(
            replace(cfg, record=path, salt_tag=label),  # a seeded sweep's points share no prompt (no cache hit)
            record=self.sweep_path is not None,
            printer_for=self.printer_for,
            final_report=self.final_report,
            stop_when=stop_when,
        )
        serving.close()  # the next point serves on the same port
        self.any_failed |= run.exit_code == 1 or any(r.status == "failed" for r in run.state.turns)
        if self.sweep_path is not None and run.recording_path is not None:
            self.result.sweep.runs.append(run.recording_path.name)
            self.save()
        return run

    def capacity_run(self, cfg: RunConfig, label: str, window_s: float) -> tuple[Run, CapacityPoint]:
        """An open-loop point, ending early once the server saturates; its point on the curve kept."""
        run = self.run(cfg, label, stop_when=lambda state: saturation(state, window_s))
        assert run.state is not None
        point = capacity_point(run.state)
        assert point is not None  # an open-loop run
        self.result.capacity.append(point)
        return run, point

    def ended(self, run: Run) -> bool:
        """Whether the sweep ends because this point was interrupted or crashed (its exit code is the sweep's)."""
        if run.exit_code in (*EXIT_INTERRUPTED, EXIT_CRASHED):
            self.result.exit_code = run.exit_code
            return True
        return False

    def stops_here(self) -> bool:
        """Whether the sweep ends at this point (saying why); else its file is brought up to date."""
        sweep = self.result.sweep
        if sweep.stopped:
            print(f"rampwatch sweep: stopped: {sweep.stopped}", flush=True)
            return True
        self.save()
        return False

    def save(self) -> None:
        if self.sweep_path is not None:
            write_sweep(self.sweep_path, self.result.sweep)

    def finish(self) -> SweepResult:
        self.save()
        self.result.exit_code = 1 if self.any_failed else 0
        return self.result


def run_sweep(
    cfg: RunConfig,
    counts: list[int],
    sweep_path: Path | None,
    printer_for: Callable[[RunState], LinePrinter],
    final_report: Callable[[RunState], str],
) -> SweepResult:
    """Closed loop: each session count headless, in lockstep, from `cfg` (its lines from `printer_for`, its
    table from `final_report`)."""
    points = _Points(sweep_path, printer_for, final_report, SweepResult(SweepFile(sessions=counts, runs=[])))
    sweep = points.result.sweep
    for n in counts:
        print(f"rampwatch sweep: {counted(n, 'session')}", flush=True)
        run = points.run(replace(cfg, sessions=n, lockstep=True), f"{n}s")
        assert run.state is not None
        points.result.points.append((n, build_report(run.state), panels.preemptions_this_run(run.state)))
        if points.ended(run):
            return points.result
        sweep.stopped = why_stop(run.state)
        if points.stops_here():
            break
    return points.finish()


def conversations_for(rate_per_s: float, seconds: float) -> int:
    """Enough conversations that the time limit, not their number, ends a point: the Poisson count's mean
    plus six standard deviations."""
    mean = rate_per_s * seconds
    return math.ceil(mean + 6 * math.sqrt(mean) + 6)


def run_open_sweep(
    cfg: RunConfig,
    plan: OpenLoopPlan,
    sweep_path: Path | None,
    printer_for: Callable[[RunState], LinePrinter],
    final_report: Callable[[RunState], str],
) -> SweepResult:
    """Open loop: a point per rate of `plan` (or per rate its search picks), each for cfg.time_limit with the
    same seed (so a higher rate's arrivals are the lower one's, sooner), ending early when the server
    saturates. A search records each point's verdict and the knee in the sweep file."""
    assert cfg.time_limit is not None
    if cfg.seed is None:  # one seed for every point, drawn here
        cfg = replace(cfg, seed=secrets.randbelow(1 << 31))
    search = plan.search
    sweep = SweepFile(runs=[], seed=cfg.seed)
    if search is not None:
        sweep.slo, sweep.slo_share = cfg.slo, plan.slo_share
    points = _Points(sweep_path, printer_for, final_report, SweepResult(sweep))
    pending = list(plan.rates)

    while (rate := search.next_rate() if search is not None else (pending.pop(0) if pending else None)) is not None:
        print(f"rampwatch sweep: {rate * 60:.4g} arrivals/min", flush=True)
        sessions = plan.sessions or conversations_for(rate, cfg.time_limit)
        run, point = points.capacity_run(
            replace(cfg, arrivals_per_s=rate, sessions=sessions), rate_label(rate), plan.saturation_window_s
        )
        sweep.arrivals_per_min.append(rate * 60)
        if points.ended(run):
            return points.result
        if point.turns == 0:
            sweep.stopped = f"no conversation arrived within --time-limit at {rate * 60:.4g}/min"
        elif search is not None:
            search.record(rate, kept_share(point, plan.slo_share))
            sweep.knee_per_min = search.knee * 60 if search.knee is not None else None
            sweep.knee_fail_per_min = search.lowest_fail * 60 if search.lowest_fail is not None else None
        elif run.stopped_early:
            sweep.stopped = f"saturated at {rate * 60:.4g}/min: {run.stopped_early}"
        if points.stops_here():
            break
    return points.finish()


def run_trace_sweep(
    cfg: RunConfig,
    plan: OpenLoopPlan,
    sweep_path: Path | None,
    printer_for: Callable[[RunState], LinePrinter],
    final_report: Callable[[RunState], str],
) -> SweepResult:
    """A trace: a point per speed of `plan`, each the whole slice (or --time-limit), each with a fresh salt so no
    point hits the one before's cache (unless --trace-warm), the sweep ending at the first saturated point."""
    assert cfg.trace is not None
    sweep = SweepFile(runs=[])
    points = _Points(sweep_path, printer_for, final_report, SweepResult(sweep))
    for speed in plan.speeds:
        print(f"rampwatch sweep: the trace at {speed:g}x", flush=True)
        run, point = points.capacity_run(
            replace(cfg, trace=replace(cfg.trace, speed=speed)), f"{speed:g}x", plan.saturation_window_s
        )
        sweep.trace_speeds.append(speed)
        if points.ended(run):
            return points.result
        if point.turns == 0:
            sweep.stopped = f"no turn finished at {speed:g}x"
        elif run.stopped_early:
            sweep.stopped = f"saturated at {speed:g}x: {run.stopped_early}"
        if points.stops_here():
            break
    return points.finish()
