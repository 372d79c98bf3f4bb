"""`rampwatch export`: a recording (or a run's shards merged) as a self-contained HTML page and/or an SVG; an
open-loop sweep's capacity curve; the Grafana dashboard."""

from __future__ import annotations

import argparse
from pathlib import Path

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.capacity import CapacityPoint, capacity_point
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.present import picture
from rampwatch.drivers.present.capacity_picture import capacity_html, capacity_svg
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.drivers.present.sweep_table import render_capacity
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.sweep import SweepFile, read_sweep_file
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.files import load_run, load_state, write_file

# Shipped beside the UI (package data of rampwatch.tui).
GRAFANA_DASHBOARD = Path(__file__).resolve().parents[1] / "grafana-dashboard.json"


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    if args.grafana_dashboard:
        code = write_file(args.grafana_dashboard, GRAFANA_DASHBOARD.read_text())
        if code or (args.path is None and not args.merge):
            return code
    if args.path is None and not args.merge:
        return fail("export needs a recording (RUN), --merge PART... (a run's shards) or --grafana-dashboard OUT")
    if not args.html and not args.svg:
        return fail("export needs --html OUT and/or --svg OUT")
    sweep = read_sweep_file(args.path) if args.path is not None and not args.merge else None
    if sweep is not None:
        return export_capacity(args, sweep)
    state = load_run(args.path, args.merge, args.skip_bad_lines, "export")
    code = 0
    if args.html:
        code = code or write_file(args.html, picture.run_html(state, summary_lines(build_report(state))))
    if args.svg:
        code = code or write_file(args.svg, picture.run_svg(state))
    return code


def export_capacity(args: argparse.Namespace, sweep: SweepFile) -> int:
    """An open-loop sweep's points, each folded from its recording, drawn as one curve."""
    if not sweep.arrivals_per_min and not sweep.trace_speeds:
        return fail(
            f"{args.path}: a closed-loop sweep (--sessions) has no capacity curve; "
            "compare it (rampwatch compare SWEEP) or export each of its recordings"
        )
    points: list[CapacityPoint] = []
    title = "rampwatch: capacity"
    for run in sweep.runs:
        path = args.path.parent / run
        if not path.is_file():
            raise BadInput(f"{args.path}: its point {run} is missing (a sweep's recordings sit beside its file)")
        state = load_state(path, args.skip_bad_lines)
        point = capacity_point(state)
        if point is None:
            raise BadInput(f"{path}: not an open-loop run (--arrivals, --trace): no capacity point")
        points.append(point)
        if state.header is not None:
            title = f"rampwatch: capacity of {state.header.model} on {state.header.engine}"
    svg = capacity_svg(points, sweep.slo_share, sweep.knee_per_min, sweep.knee_fail_per_min)
    code = 0
    if args.html:
        table = render_capacity(points, sweep.slo_share, sweep.knee_per_min, sweep.knee_fail_per_min)
        slo = f" · SLO {sweep.slo} for {sweep.slo_share:.0%} of turns" if sweep.slo and sweep.slo_share else ""
        source = "a trace at several speeds" if sweep.trace_speeds else f"seed {sweep.seed}"
        info = f"{args.path.name} · {counted(len(points), 'point')} · {source}{slo}"
        code = write_file(args.html, capacity_html(title, info, svg, table))
    if args.svg:
        code = code or write_file(args.svg, svg)
    return code
