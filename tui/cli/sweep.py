"""`rampwatch sweep`, headless: the same ramp at several session counts in lockstep (closed loop), or
conversations arriving at several rates (open loop, --arrivals), or the search for the highest rate that keeps
an SLO (--find-max), or a trace at several speeds (--trace, --trace-speed): a capacity curve."""

from __future__ import annotations

import argparse
import sys

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.drivers.present.sweep_table import render_capacity, render_curve
from rampwatch.drivers.run.config import default_record_path
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED
from rampwatch.drivers.run.recording import Recorder
from rampwatch.drivers.run.sweep_loop import EXIT_INTERRUPTED, run_open_sweep, run_sweep, run_trace_sweep
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.launch import report_table
from rampwatch.tui.cli.options import config_from, open_loop_plan
from rampwatch.tui.headless_lines import HeadlessPrinter


def point_summary(state: RunState) -> str:
    """An open-loop point's end: its summary lines (a table per conversation would bury the curve)."""
    return "\n".join(summary_lines(build_report(state)))


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    """Each point in turn, recorded; stops when the server starts to fail, preempt or saturate."""
    if args.web:
        return fail(
            "--web is for run, watch, demo and replay; a sweep prints its curve (replay its recordings with --web)"
        )
    plan = open_loop_plan(args)  # BadInput (exit 2) for a bad open loop, before anything is written
    if plan is None and args.sessions is None:
        return fail(
            "sweep needs --sessions N,N,... (closed loop), --arrivals RATES / --find-max (open loop) or --trace FILE"
        )
    cfg = config_from(args, "run", argv)
    sweep_path = None if args.no_record else (args.record or default_record_path("sweep").with_suffix(".sweep.json"))
    if sweep_path is not None:
        if args.record is None:
            sweep_path.parent.mkdir(parents=True, exist_ok=True)  # the default folder; a --record folder must exist
        problem = Recorder.check_path(sweep_path)
        if problem:
            return fail(problem)
    if plan is None:
        result = run_sweep(cfg, args.sessions, sweep_path, HeadlessPrinter, report_table)
    elif plan.speeds:
        result = run_trace_sweep(cfg, plan, sweep_path, HeadlessPrinter, point_summary)
    else:
        result = run_open_sweep(cfg, plan, sweep_path, HeadlessPrinter, point_summary)
    if result.exit_code in (*EXIT_INTERRUPTED, EXIT_CRASHED):
        return result.exit_code
    if sweep_path is not None:
        print(f"sweep: {sweep_path}", file=sys.stderr)
    if plan is None:
        print(render_curve(result.points))
    else:
        sweep = result.sweep
        share = plan.slo_share if plan.search is not None else None
        print(render_capacity(result.capacity, share, sweep.knee_per_min, sweep.knee_fail_per_min))
    return result.exit_code
