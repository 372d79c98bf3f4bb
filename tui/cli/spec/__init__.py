"""The argument spec: every command with its flags, help texts, defaults and choices (docs/cli.md is generated
from it), one module per command family; build_parser() puts them together."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import rampwatch.drivers as drivers
from rampwatch.tui.cli.spec.parser import OneLineParser
from rampwatch.tui.cli.spec.reading import add_compare_args, add_export_args, add_replay_args, add_report_args
from rampwatch.tui.cli.spec.run import add_run_args, add_watch_args
from rampwatch.tui.cli.spec.simulated import add_demo_args, add_sim_command_args
from rampwatch.tui.cli.spec.sweep import add_sweep_args
from rampwatch.tui.cli.spec.trace import add_trace_args

# Every command in the order --help lists them: name, one-line help, the function that adds its flags (called
# only when that command is parsed or its help shown, so `rampwatch report` never imports the simulator).
COMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None]]] = [
    ("run", "drive ramps against one or more servers and watch them live", add_run_args),
    ("watch", "watch servers' metrics and GPUs without sending traffic", add_watch_args),
    ("demo", "run a ramp against the built-in simulated engine (no GPU, no network)", add_demo_args),
    ("sim", "serve the simulated engine (vLLM's HTTP surface) for any client", add_sim_command_args),
    ("replay", "replay a recording in the UI", add_replay_args),
    ("compare", "recordings side by side (a sweep file counts as its runs)", add_compare_args),
    ("export", "pictures of a recording (a self-contained HTML page, SVG); the Grafana dashboard", add_export_args),
    (
        "sweep",
        "capacity curves: the same ramp at several session counts in lockstep, or users arriving at several "
        "rates (open loop), or a search for the knee (--find-max: the highest rate that keeps an SLO)",
        add_sweep_args,
    ),
    ("report", "per-turn tables of a recording", add_report_args),
    (
        "trace",
        "a workload trace on its own: `trace info FILE` (sessions, sizes, ideal reuse), `trace export` (for AIPerf)",
        add_trace_args,
    ),
]


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="rampwatch",
        description="Drive growing long-context conversations against an OpenAI-compatible server and watch them.",
    )
    parser.add_argument("--version", action="version", version=f"rampwatch {drivers.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for name, help_text, populate in COMMANDS:
        sub.add_parser(name, help=help_text, description=help_text, populate=populate)
    return parser


__all__ = ["COMMANDS", "OneLineParser", "build_parser"]
