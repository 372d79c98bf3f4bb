"""The flags that spread a run's sessions over driver processes (run, demo, sweep) and machines (run's shards)."""

from __future__ import annotations

import argparse

from rampwatch.tui.cli.argtypes import positive_int


def add_worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        default="1",
        metavar="N|auto",
        help="drive the sessions from N worker processes behind this one (one recording, one UI, one report); "
        "auto: one per core beyond the first (default 1: this process drives them); with --trace, this process "
        "reads the trace and hands each session's requests to its worker",
    )
    p.add_argument(
        "--cluster",
        metavar="ray|ray://HOST:PORT",
        help="run the workers as Ray actors, --workers-per-node on each node (the coordinator stays here): ray "
        "starts a local Ray runtime (or joins RAY_ADDRESS), ray://HOST:PORT joins a running cluster through its "
        "Ray Client port (10001 unless its head set --ray-client-server-port); needs the rampwatch[ray] extra",
    )
    p.add_argument(
        "--workers-per-node",
        type=positive_int,
        default=1,
        metavar="N",
        help="with --cluster: worker actors on each node (default 1)",
    )
    p.add_argument(
        "--workers-restart",
        action="store_true",
        help="replace a worker that dies: a new one picks its sessions (a trace's too) up at their next turn, with "
        "their history "
        "(the coordinator keeps every session's history for it); the turns it had in flight stay failed",
    )


def add_shard_args(p: argparse.ArgumentParser) -> None:
    """run's: one shard of a run that several rampwatch processes share without talking (a Kubernetes Indexed Job)."""
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I (0-based) of N of a seeded run: sessions k with (k-1) mod N = I; with --seed "
        "and --start-at, so the N shards are one run (merge them with report --merge); with --trace, each shard "
        "reads the file itself and replays the trace's sessions k (by first appearance) of its own",
    )
    p.add_argument(
        "--start-at",
        metavar="TIME",
        help="start the sessions at this wall-clock time, ISO 8601 (2026-12-03T20:00:00Z) or Unix seconds: "
        "how separate shards start together",
    )
