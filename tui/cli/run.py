"""`rampwatch run` and `rampwatch watch`: drive ramps against servers (or only watch them), live."""

from __future__ import annotations

import argparse

from rampwatch.tui.cli.launch import execute_run
from rampwatch.tui.cli.options import config_from


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    cfg = config_from(args, args.command, argv)
    return execute_run(cfg, record=not args.no_record, headless=args.headless, web=args.web, refresh_s=args.refresh)
