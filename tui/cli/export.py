"""`rampwatch export`: a recording as a self-contained HTML page and/or an SVG; the Grafana dashboard."""

from __future__ import annotations

import argparse
from pathlib import Path

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.present import picture
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.files import read_noting, write_file

# Shipped beside the UI (package data of rampwatch.tui).
GRAFANA_DASHBOARD = Path(__file__).resolve().parents[1] / "grafana-dashboard.json"


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    if args.grafana_dashboard:
        code = write_file(args.grafana_dashboard, GRAFANA_DASHBOARD.read_text())
        if code or args.path is None:
            return code
    if args.path is None:
        return fail("export needs a recording (RUN), or --grafana-dashboard OUT")
    if not args.html and not args.svg:
        return fail("export needs --html OUT and/or --svg OUT")
    rec = read_noting(args.path, args.skip_bad_lines)
    series = picture.fold(rec.header, rec.events)
    code = 0
    if args.html:
        code = code or write_file(args.html, picture.run_html(series, summary_lines(build_report(series.state))))
    if args.svg:
        code = code or write_file(args.svg, picture.run_svg(series))
    return code
