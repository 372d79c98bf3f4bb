"""The flags of run and watch, and the open loop (arriving users, their SLO) that run shares with sweep."""

from __future__ import annotations

import argparse

from rampwatch.tui.cli.argtypes import positive_int
from rampwatch.tui.cli.spec.common import add_server_watch_args
from rampwatch.tui.cli.spec.ramp import add_ramp_args
from rampwatch.tui.cli.spec.trace import add_trace_replay_args
from rampwatch.tui.cli.spec.workers import add_shard_args


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "url",
        metavar="URL",
        nargs="+",
        help="server base URL, e.g. http://127.0.0.1:8000; several: sessions are spread over them round-robin",
    )
    add_ramp_args(p)
    add_trace_replay_args(p)
    add_open_loop_args(p)
    add_pin_arg(p)
    add_shard_args(p)
    add_server_watch_args(p)


def add_pin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="SESSION=URL",
        help="send a session's turns to one of the servers (its URL or name), e.g. s1=http://10.0.0.2:8000 "
        "(repeatable; the others go round-robin)",
    )


def add_open_loop_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """Arriving users and the latency they were promised (run, and sweep's open loop)."""
    if sweep:
        p.add_argument(
            "--arrivals",
            metavar="RATES|LOW..HIGH",
            help="open loop: a point per arrival rate, each run for --time-limit, e.g. 0.5,1,2,4/min (a unit on "
            "the last rate applies to all); with --find-max the range searched, e.g. 0.5..8/min (default "
            "0.25..8/min)",
        )
    else:
        p.add_argument(
            "--arrivals",
            metavar="RATE",
            help="open loop: a new conversation (a full ramp) at each arrival of a Poisson process of RATE, e.g. "
            "2/min, 0.5/s, 30/h (a plain number is per minute), until --sessions have started or --time-limit; "
            "latency counts from when each turn was due (not with --lockstep or --stagger)",
        )
    p.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="seed of the run: its prompts (the same seed sends the same text, so a second run against a server "
        "still caching the first hits its cache) and, with --arrivals, its arrival times (default: arrival times "
        "drawn and recorded in the header, prompts from a fresh salt)",
    )
    p.add_argument(
        "--max-live",
        type=positive_int,
        metavar="N",
        help="with --arrivals: at most N conversations live at once; later arrivals wait, and their wait counts",
    )
    p.add_argument(
        "--slo",
        metavar="BOUNDS",
        help="per-turn objectives, any of ttft, answer (first answer token), gap (worst inter-token gap), tpot "
        "(mean time per output token), e.g. ttft=90s,gap=1s,tpot=100ms; ttft may scale with the turn's new "
        "tokens: ttft=0.7ms/token. Each turn gets a verdict; goodput counts the turns meeting every bound",
    )
    p.add_argument(
        "--warmup",
        metavar="DURATION|N",
        help="with --slo: leave the run's start out of the figures (goodput, late turns, a sweep point's turns/min "
        "and TTFT), a time (e.g. 60s: turns due before it) or the first N arrivals (e.g. 3: conversations "
        "s1..s3); the report says what was left out",
    )


def add_watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "url", metavar="URL", nargs="*", help="server base URL (several: one endpoint each; none with --prometheus)"
    )
    add_server_watch_args(p)
