"""`rampwatch trace info`: a trace file's sessions, sizes, rates, ideal reuse and peak live context, read as a
stream (a 100K-row trace in seconds, in bounded memory)."""

from __future__ import annotations

import argparse
import sys

import msgspec

from rampwatch.drivers.model.trace_slice import TraceSlice
from rampwatch.drivers.model.trace_stats import TraceInfo, TraceStats
from rampwatch.drivers.present.trace_info import render_trace_info
from rampwatch.drivers.run.trace_read import open_trace


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    info = trace_info(args)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(info)).decode() + "\n")
    else:
        sys.stdout.write(render_trace_info(info))
    return 0


def trace_info(args: argparse.Namespace) -> TraceInfo:
    trace = open_trace(args.path, args.trace_format, args.trace_block_size, args.trace_skip_bad)
    cut = TraceSlice(
        start_s=args.trace_start,
        duration_s=args.trace_duration,
        sessions=args.trace_sessions,
        max_context=args.trace_max_context,
    )
    stats = TraceStats()
    for request in trace.requests(cut, args.trace_kv_tokens):
        stats.add(request)
    return stats.finish(
        path=str(args.path),
        format=trace.format,
        block_size=trace.block_size,
        kv_tokens=args.trace_kv_tokens,
        skipped=trace.skipped,
        stopped_at_duration=trace.slice_counts.ended,
    )
