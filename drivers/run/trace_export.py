"""`rampwatch trace export`: a trace (a recording above all) written as a Mooncake or an AIPerf multi_turn trace
(drivers/model/trace_export.py), streamed. It is written beside OUT and renamed over it once whole, so a bad row
or a full disk leaves no half-written trace, and an OUT already there is replaced only when asked (--force)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from rampwatch.drivers.model.trace_export import EXPORT_FORMATS, AiperfSessions, MooncakeRows
from rampwatch.drivers.model.trace_slice import TraceSlice
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.trace_read import TraceReading


@dataclass(slots=True)
class Exported:
    """What was written: the sessions and requests (AIPerf: a session split where its context shrank counts
    twice), and for Mooncake the distinct blocks its hash ids name."""

    path: Path
    format: str
    sessions: int = 0
    requests: int = 0
    blocks: int = 0
    split: int = 0


def check_output(out: Path, force: bool) -> None:
    """BadInput unless OUT can be written: not a folder, and not there already unless `force`."""
    if out.is_dir():
        raise BadInput(f"{out} is a folder; name the trace to write, e.g. {out / 'trace.jsonl'}")
    if out.exists() and not force:
        raise BadInput(f"{out} already exists (choose another --output, or --force to replace it)")


def export_trace(reading: TraceReading, cut: TraceSlice | None, fmt: str, out: Path, force: bool) -> Exported:
    """Write `reading`'s requests, cut to `cut`, to `out` as `fmt` (mooncake or aiperf); BadInput for anything
    that stops it (nothing is left at `out` then)."""
    if fmt not in EXPORT_FORMATS:
        raise BadInput(f"unknown export format {fmt!r} (choose from {', '.join(EXPORT_FORMATS)})")
    check_output(out, force)
    done = Exported(out, fmt)
    partial = out.with_name(out.name + ".partial")
    encode = msgspec.json.Encoder().encode
    try:
        with open(partial, "wb") as f:
            if fmt == "mooncake":
                rows = MooncakeRows(reading.block_size)
                for r in reading.requests(cut):
                    f.write(encode(rows.row(r)) + b"\n")
                    done.requests += 1
                    done.sessions += r.turn == 1
                done.blocks = rows.blocks.distinct
            else:
                sessions = AiperfSessions()
                for r in reading.requests(cut):
                    done.requests += 1
                    f.writelines(encode(line) + b"\n" for line in sessions.add(r))
                f.writelines(encode(line) + b"\n" for line in sessions.finish())
                done.sessions, done.split = sessions.started, sessions.split
        if not done.requests:
            raise BadInput(f"{reading.path}: no request to export (skipped: {reading.skipped or 'none'})")
        os.replace(partial, out)
    except OSError as e:
        raise BadInput(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        partial.unlink(missing_ok=True)
    return done
