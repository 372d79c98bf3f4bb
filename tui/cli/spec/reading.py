"""The flags of the commands that read recordings: replay, compare, export and report."""

from __future__ import annotations

import argparse
from pathlib import Path

from rampwatch.drivers.present.report import FORMATS
from rampwatch.tui.cli.spec.common import add_refresh_arg, add_web_arg


def add_skip_bad_lines_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-bad-lines", action="store_true", help="read past corrupt lines instead of stopping")


def add_merge_arg(p: argparse.ArgumentParser, many: bool = False) -> None:
    """--merge PART...: the recordings of one run's shards (run --shard I/N), read as that one run."""
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        action="append" if many else "store",
        default=[] if many else None,
        metavar="PART",
        help=(
            "one more run, merged from the recordings of its shards (run --shard I/N; repeatable: one --merge per run, "
            "its column after the RUNs)"
            if many
            else "the run, merged from the recordings of its shards (run --shard I/N), instead of a recording"
        ),
    )


def add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="PATH", help="the recording (.jsonl) to replay")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="playback speed, 0.25 to 64 (default 1)")
    p.add_argument("--headless", action="store_true", help="print the run's turn lines instead of the UI")
    add_refresh_arg(p)
    p.add_argument(
        "--follow",
        action="store_true",
        help="show a run as its recording grows (a run in progress, e.g. started by someone else)",
    )
    add_web_arg(p)
    add_skip_bad_lines_arg(p)


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        type=Path,
        nargs="*",
        metavar="RUN",
        help="recordings (.jsonl) or sweep files (.sweep.json), in the order their columns appear",
    )
    add_merge_arg(p, many=True)
    p.add_argument("--format", choices=FORMATS, default="table", help="table (default), md, csv or json")
    p.add_argument(
        "--baseline", metavar="RUN", help="the run the per-turn ratios divide by: its path or label (default the first)"
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="a label per run, in order (repeatable; default model@engine)",
    )
    p.add_argument(
        "--html", type=Path, metavar="OUT", help="also write the table and a TTFT-per-turn chart as one HTML page"
    )
    add_skip_bad_lines_arg(p)


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        type=Path,
        metavar="RUN",
        nargs="?",
        help="the recording (.jsonl) to draw, or an open-loop sweep's file (.sweep.json): its capacity curve",
    )
    add_merge_arg(p)
    p.add_argument(
        "--grafana-dashboard",
        type=Path,
        metavar="OUT",
        help="write the Grafana dashboard for --serve-metrics (with vLLM's metrics beside) as JSON",
    )
    p.add_argument(
        "--html",
        type=Path,
        metavar="OUT",
        help="the timeline, TTFT against context and the summary, as HTML (a sweep: its curve and table)",
    )
    p.add_argument(
        "--svg", type=Path, metavar="OUT", help="the timeline and the TTFT chart as one SVG (a sweep: its curve)"
    )
    add_skip_bad_lines_arg(p)


def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path", type=Path, metavar="PATH", nargs="?", help="the recording (.jsonl) to tabulate (or --merge PART...)"
    )
    add_merge_arg(p)
    p.add_argument("--format", choices=FORMATS, default="table", help="table (default), md, csv or json")
    add_skip_bad_lines_arg(p)
