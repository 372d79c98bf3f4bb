"""`rampwatch replay`: a recording in the UI (at any speed, or following a run in progress), in browsers
(--web), or as the line output the live run printed (--headless)."""

from __future__ import annotations

import argparse

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.report import render
from rampwatch.drivers.run.recording import read_recording
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.files import load_state


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    if not 0.25 <= args.speed <= 64:
        return fail("--speed must be between 0.25 and 64")
    if args.web or args.follow:  # bad input is one line, before a server or a UI opens
        read_recording(args.path, skip_bad_lines=args.skip_bad_lines)
    if args.web:
        from rampwatch.tui.cli.web_option import serve_until_interrupted, serve_web
        from rampwatch.tui.web_server import page_command

        page = page_command(args.path, follow=args.follow, speed=args.speed, refresh_s=args.refresh)
        server = serve_web(args.web, page, "rampwatch replay")
        serve_until_interrupted(server, f"serving {'the growing' if args.follow else 'a replay of'} {args.path}")
        return 0
    if args.follow:
        from rampwatch.tui.app import run_app_follow

        return run_app_follow(args.path, args.refresh)
    if args.headless:
        return print_lines(args)
    from rampwatch.tui.app import run_app_replay

    return run_app_replay(
        read_recording(args.path, skip_bad_lines=args.skip_bad_lines), speed=args.speed, refresh_s=args.refresh
    )


def print_lines(args: argparse.Namespace) -> int:
    """The same lines the live run printed, event by event, then its report."""
    from rampwatch.tui.headless_lines import HeadlessPrinter

    printers: list[HeadlessPrinter] = []

    def show(state: RunState) -> None:
        if not printers:
            printers.append(HeadlessPrinter(state))
        printers[0]()

    state = load_state(args.path, args.skip_bad_lines, show)
    if state.header is not None and state.header.mode != "watch":
        print(render(build_report(state), "table"))
    return 0
