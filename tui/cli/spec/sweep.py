"""The flags of sweep: the ramp and the open loop as run takes them, and the search for the knee (--find-max)."""

from __future__ import annotations

import argparse

from rampwatch.tui.cli.argtypes import duration, positive_int, share
from rampwatch.tui.cli.spec.common import add_server_watch_args
from rampwatch.tui.cli.spec.ramp import add_ramp_args
from rampwatch.tui.cli.spec.run import add_open_loop_args
from rampwatch.tui.cli.spec.trace import add_trace_replay_args


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", nargs="+", help="server base URL (several: sessions spread round-robin)")
    add_ramp_args(p, sweep=True)
    add_open_loop_args(p, sweep=True)
    add_trace_replay_args(p, sweep=True)
    add_knee_args(p)
    add_server_watch_args(p, ui=False)


def add_knee_args(p: argparse.ArgumentParser) -> None:
    """sweep --find-max: the search for the highest arrival rate that keeps the SLO."""
    p.add_argument(
        "--find-max",
        action="store_true",
        help="search (bisection on the rate) for the highest arrival rate whose turns meet --slo for at least "
        "--slo-share of them; prints the knee and what the engine's KV pool would have said",
    )
    p.add_argument(
        "--slo-share",
        type=share,
        default=0.95,
        metavar="PCT",
        help="with --find-max: the share of turns that must meet --slo, e.g. 95%% or 0.95 (default 95%%)",
    )
    p.add_argument(
        "--max-points",
        type=positive_int,
        default=6,
        metavar="N",
        help="with --find-max: run at most N points (default 6; at least 3 for a bracket and one bisection)",
    )
    p.add_argument(
        "--saturation-window",
        type=duration,
        default=60.0,
        metavar="DURATION",
        help="an open-loop point ends early, saturated, once the server's waiting queue never emptied and kept "
        "growing for this long (default 60s), or a turn failed, or the server preempted",
    )
