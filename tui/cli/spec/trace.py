"""The flags of `rampwatch trace` and its subcommands: a trace file (Mooncake, Qwen-Bailian, agentic, AIPerf
multi_turn, a rampwatch recording) read on its own."""

from __future__ import annotations

import argparse
from pathlib import Path

from rampwatch.drivers.client.ramp import ScheduleError, parse_tokens
from rampwatch.drivers.model.trace import BLOCK_SIZES, TRACE_FORMATS
from rampwatch.drivers.model.trace_export import EXPORT_FORMATS
from rampwatch.drivers.run.config import BadInput, parse_duration
from rampwatch.tui.cli.argtypes import duration, positive_int, speed, speeds
from rampwatch.tui.cli.spec.parser import OneLineParser

INFO_HELP = (
    "a trace's sessions and turns, requests per minute, context sizes, growth per turn, ideal hit rate and peak "
    "live context, streamed from the file"
)
EXPORT_HELP = (
    "write a trace (a recorded run above all) as a trace AIPerf replays: Mooncake JSONL with session ids and "
    "512-token hash ids chained from its prompts' blocks, or AIPerf multi_turn"
)


def token_count(text: str) -> int:
    try:
        return parse_tokens(text)
    except ScheduleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def start_time(text: str) -> float:
    """A time from the trace's start, zero allowed ('0', '90s', '1h')."""
    try:
        return parse_duration(text, zero=True)
    except BadInput as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_trace_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(
        dest="trace_command",
        required=True,
        metavar="SUBCOMMAND",
        parser_class=OneLineParser,
        help="what to do with the trace: info, export",
    )
    sub.add_parser("info", help=INFO_HELP, description=INFO_HELP, populate=add_trace_info_args)
    sub.add_parser("export", help=EXPORT_HELP, description=EXPORT_HELP, populate=add_trace_export_args)


def add_trace_info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        type=Path,
        metavar="FILE",
        help="the trace: Mooncake JSONL, Qwen-Bailian CSV or JSONL, agentic JSON, AIPerf multi_turn JSONL or a "
        "rampwatch recording (gzip or not)",
    )
    add_trace_source_args(p, "--")
    p.add_argument("--json", action="store_true", help="the figures as JSON instead of text")
    p.add_argument(
        "--svg",
        type=Path,
        metavar="OUT",
        help="also draw the trace as an SVG: requests per minute and the live context over its time",
    )
    p.add_argument("--html", type=Path, metavar="OUT", help="also write that picture and the figures as one HTML page")


def add_trace_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        type=Path,
        metavar="SOURCE",
        help="the trace to write out: a rampwatch recording above all, or any trace `trace info` reads",
    )
    p.add_argument(
        "--format",
        dest="export_format",
        choices=EXPORT_FORMATS,
        required=True,
        help="mooncake: one row a request with 512-token hash ids (AIPerf's mooncake_trace); aiperf: AIPerf "
        "multi_turn, one line a session, each turn its new message",
    )
    p.add_argument("--output", "-o", type=Path, required=True, metavar="OUT", help="the file to write")
    p.add_argument("--force", action="store_true", help="replace OUT if it is already there")
    add_trace_source_args(p, "--", pool=False, format_flag="--from")


def add_trace_replay_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """--trace and its flags on run, demo and sweep (where --trace-speed takes a list): the sessions come from a
    trace."""
    p.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help="replay this trace's sessions (Mooncake, Qwen-Bailian, agentic, AIPerf multi_turn, a recording): "
        "each its own session, its turns' prompts built from their hash-id blocks, sent when the trace has them due",
    )
    add_trace_source_args(p, "--trace-")
    p.add_argument(
        "--trace-api",
        choices=("completions", "chat"),
        default="completions",
        help="how each prompt is sent: completions (default: the prompt as built, so shared blocks are shared "
        "tokens to the last one) or chat (one user message: the chat template's tokens after it are not shared "
        "with the next turn)",
    )
    p.add_argument(
        "--trace-timing",
        choices=("session", "open"),
        default="session",
        help="session (default): a session's next turn goes after its previous reply plus the trace's gap between "
        "the two, a user who waits for the answer; open: every request at its time in the trace, reply or not",
    )
    p.add_argument(
        "--trace-speed",
        type=speeds if sweep else speed,
        default=[1.0] if sweep else 1.0,
        metavar="X,X,..." if sweep else "X",
        help="the trace's times (and gaps) divided by X, e.g. "
        + ("0.5,1,2,4: one point per speed, the capacity curve of this traffic" if sweep else "2 (default 1)"),
    )
    p.add_argument(
        "--trace-warm",
        action="store_true",
        help="build the prompts from the trace's own salt, not a fresh one, so a run after this one (also "
        "--trace-warm) finds its blocks in the server's prefix cache",
    )


def add_trace_source_args(
    p: argparse.ArgumentParser, prefix: str, pool: bool = True, format_flag: str | None = None
) -> None:
    """How a trace is read and cut, as `trace info` (--format, ...) and a replay (--trace-format, ...) name it;
    either way into args.trace_format, args.trace_block_size, ...; `pool`: with the KV pool for the ideal reuse;
    `format_flag`: the source format's flag where --format names something else (`trace export --from`)."""
    blocks = ", ".join(f"{fmt} {BLOCK_SIZES[fmt]}" for fmt in TRACE_FORMATS)

    def flag(name: str, **kw: object) -> None:
        p.add_argument(prefix + name, dest="trace_" + name.replace("-", "_"), **kw)  # type: ignore[arg-type]

    p.add_argument(
        format_flag or prefix + "format",
        dest="trace_format",
        choices=("auto", *TRACE_FORMATS),
        default="auto",
        help="the trace's format (default auto: told by its first line)",
    )
    flag(
        "block-size",
        type=positive_int,
        metavar="N",
        help=f"tokens a hash id stands for (default {blocks}; a recording of a --trace run: that trace's)",
    )
    if pool:
        flag(
            "kv-tokens",
            type=token_count,
            metavar="TOKENS",
            help="also the ideal hit rate with an LRU pool of this many KV tokens, e.g. 1m",
        )
    flag(
        "start",
        type=start_time,
        default=0.0,
        metavar="TIME",
        help="leave out requests due before this time from the trace's start, e.g. 1h (default 0)",
    )
    flag("duration", type=duration, metavar="TIME", help="read only this long after the start, e.g. 30m")
    flag("sessions", type=positive_int, metavar="N", help="only the first N sessions to start")
    flag(
        "max-context",
        type=token_count,
        metavar="TOKENS",
        help="leave out, and count, requests with a longer prompt, e.g. 128k",
    )
    flag(
        "skip-bad",
        action="store_true",
        help="skip and count the rows that cannot be used instead of stopping at the first",
    )
