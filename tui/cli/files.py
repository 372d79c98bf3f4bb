"""Reading recordings and writing outputs for the commands, with notes and failures said on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.recording import Recording, read_recording
from rampwatch.tui.cli.errors import fail


def read_noting(path: Path, skip_bad_lines: bool) -> Recording:
    """Read a recording; what had to be skipped is said on stderr."""
    rec = read_recording(path, skip_bad_lines=skip_bad_lines)
    if rec.truncated_tail:
        print(
            "rampwatch: note: the last line was cut off (a killed run); read up to the last complete event",
            file=sys.stderr,
        )
    if rec.skipped_lines:
        print(f"rampwatch: note: skipped corrupt lines: {', '.join(map(str, rec.skipped_lines[:10]))}", file=sys.stderr)
    return rec


def load_state(path: Path, skip_bad_lines: bool, listener: Callable[[RunState], None] | None = None) -> RunState:
    """Fold a recording into a RunState (calling `listener(state)` after each event)."""
    rec = read_noting(path, skip_bad_lines)
    state = RunState(rec.header)
    for e in rec.events:
        state.apply(e)
        if listener is not None:
            listener(state)
    return state


def write_file(path: Path, text: str) -> int:
    """Write an output file; 0, or exit 2 with one line when it cannot be written."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        return fail(f"cannot write {path}: {e.strerror or e}")
    print(f"wrote {path} ({len(text.encode()) / 1024:,.0f} KB)", file=sys.stderr)
    return 0
