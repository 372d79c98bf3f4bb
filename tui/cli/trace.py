"""`rampwatch trace info`: a trace file's sessions, sizes, rates, ideal reuse and peak live context, read as a
stream (a 100K-row trace in seconds, in bounded memory), and drawn small with --svg/--html. `rampwatch trace
export`: a trace (a recording above all) written as a Mooncake or AIPerf multi_turn trace."""

from __future__ import annotations

import argparse
import sys

import msgspec

from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.trace import BLOCK_SIZES
from rampwatch.drivers.model.trace_slice import TraceSlice
from rampwatch.drivers.model.trace_stats import TraceCurves, TraceInfo, TraceStats
from rampwatch.drivers.present.trace_info import render_trace_info
from rampwatch.drivers.present.trace_picture import trace_html, trace_svg
from rampwatch.drivers.run.trace_export import check_output, export_trace
from rampwatch.drivers.run.trace_read import TraceReading, open_trace
from rampwatch.tui.cli.files import write_file


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    if args.trace_command == "export":
        return export(args)
    info, curves = trace_info(args)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(info)).decode() + "\n")
    else:
        sys.stdout.write(render_trace_info(info))
    code = 0
    if args.svg:
        code = code or write_file(args.svg, trace_svg(info, curves))
    if args.html:
        code = code or write_file(args.html, trace_html(info, curves))
    return code


def trace_info(args: argparse.Namespace) -> tuple[TraceInfo, TraceCurves]:
    trace = open_trace(args.path, args.trace_format, args.trace_block_size, args.trace_skip_bad)
    stats = TraceStats()
    for request in trace.requests(cut_of(args), args.trace_kv_tokens):
        stats.add(request)
    say_notes(trace)
    info = stats.finish(
        path=str(args.path),
        format=trace.format,
        block_size=trace.block_size,
        kv_tokens=args.trace_kv_tokens,
        skipped=trace.skipped,
        stopped_at_duration=trace.slice_counts.ended,
    )
    return info, stats.curves()


def export(args: argparse.Namespace) -> int:
    check_output(args.output, args.force)  # before the source is read: a refusal costs nothing
    trace = open_trace(args.path, args.trace_format, args.trace_block_size, args.trace_skip_bad)
    done = export_trace(trace, cut_of(args), args.export_format, args.output, args.force)
    say_notes(trace)
    blocks = f", {done.blocks:,} distinct {BLOCK_SIZES['mooncake']}-token blocks" if done.format == "mooncake" else ""
    split = f" ({done.split:,} split where the context shrank)" if done.split else ""
    skipped = sum(trace.skipped.values())
    left_out = f"; {skipped:,} left out (run `trace info` with the same flags for why)" if skipped else ""
    print(
        f"wrote {done.path}: {counted(done.sessions, 'session')}{split}, {counted(done.requests, 'request')} as "
        f"{done.format}{blocks}{left_out}",
        file=sys.stderr,
    )
    return 0


def cut_of(args: argparse.Namespace) -> TraceSlice:
    return TraceSlice(
        start_s=args.trace_start,
        duration_s=args.trace_duration,
        sessions=args.trace_sessions,
        max_context=args.trace_max_context,
    )


def say_notes(trace: TraceReading) -> None:
    for note in trace.notes:
        print(f"rampwatch: note: {note}", file=sys.stderr)
