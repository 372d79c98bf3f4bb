"""`rampwatch report`: the per-turn tables of a recording (or of a run's shards merged), as the live run printed
them."""

from __future__ import annotations

import argparse
import sys

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.present.report import render
from rampwatch.tui.cli.files import load_run


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    state = load_run(args.path, args.merge, args.skip_bad_lines, "report")
    sys.stdout.write(render(build_report(state), args.format))
    return 0
