"""`rampwatch report`: the per-turn tables of a recording, as the live run printed them."""

from __future__ import annotations

import argparse
import sys

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.present.report import render
from rampwatch.tui.cli.files import load_state


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    sys.stdout.write(render(build_report(load_state(args.path, args.skip_bad_lines)), args.format))
    return 0
