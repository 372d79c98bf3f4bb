"""`rampwatch sweep`: the same ramp at several session counts, in lockstep, headless: a capacity curve."""

from __future__ import annotations

import argparse
import sys

from rampwatch.drivers.present.report import render_curve
from rampwatch.drivers.run.config import default_record_path
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED
from rampwatch.drivers.run.recording import Recorder
from rampwatch.drivers.run.sweep_loop import EXIT_INTERRUPTED, run_sweep
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.launch import report_table
from rampwatch.tui.cli.options import config_from
from rampwatch.tui.headless import HeadlessPrinter


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    """Each session count in turn, recorded; stops when the server starts to fail or preempt."""
    if args.web:
        return fail(
            "--web is for run, watch, demo and replay; a sweep prints its curve (replay its recordings with --web)"
        )
    sweep_path = None if args.no_record else (args.record or default_record_path("sweep").with_suffix(".sweep.json"))
    if sweep_path is not None:
        if args.record is None:
            sweep_path.parent.mkdir(parents=True, exist_ok=True)  # the default folder; a --record folder must exist
        problem = Recorder.check_path(sweep_path)
        if problem:
            return fail(problem)
    result = run_sweep(config_from(args, "run", argv), args.sessions, sweep_path, HeadlessPrinter, report_table)
    if result.exit_code in (*EXIT_INTERRUPTED, EXIT_CRASHED):
        return result.exit_code
    if sweep_path is not None:
        print(f"sweep: {sweep_path}", file=sys.stderr)
    print(render_curve(result.points))
    return result.exit_code
