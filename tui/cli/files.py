"""Reading recordings and writing outputs for the commands, with notes and failures said on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.merge import read_shards
from rampwatch.drivers.run.recording import Recording, read_recording
from rampwatch.tui.cli.errors import fail


def read_noting(path: Path, skip_bad_lines: bool, named: bool = False) -> Recording:
    """Read a recording; what had to be skipped is said on stderr (`named`: with the file's name, one of several)."""
    rec = read_recording(path, skip_bad_lines=skip_bad_lines)
    of = f"{path}: " if named else ""
    if rec.truncated_tail:
        print(
            f"rampwatch: note: {of}the last line was cut off (a killed run); read up to the last complete event",
            file=sys.stderr,
        )
    if rec.skipped_lines:
        print(
            f"rampwatch: note: {of}skipped corrupt lines: {', '.join(map(str, rec.skipped_lines[:10]))}",
            file=sys.stderr,
        )
    return rec


def read_merged(parts: list[Path], skip_bad_lines: bool) -> Recording:
    """The shard recordings `parts` read as their one run (drivers/run/merge.py); what it lacks is said on stderr."""
    merged = read_shards(parts, lambda path: read_noting(path, skip_bad_lines, named=True))
    for note in merged.notes:
        print(f"rampwatch: note: {note}", file=sys.stderr)
    return merged.recording


def load_run(path: Path | None, merge: list[Path] | None, skip_bad_lines: bool, command: str) -> RunState:
    """The one run a reading command was given: a recording, or (--merge) the shards of one run merged."""
    if merge and path is not None:
        raise BadInput(f"{command}: a recording ({path}) or --merge PART..., not both")
    if merge:
        return fold(read_merged(merge, skip_bad_lines))
    if path is None:
        raise BadInput(f"{command} needs a recording, or --merge PART... (the shards of one run)")
    return load_state(path, skip_bad_lines)


def load_state(path: Path, skip_bad_lines: bool, listener: Callable[[RunState], None] | None = None) -> RunState:
    """Fold a recording into a RunState (calling `listener(state)` after each event)."""
    return fold(read_noting(path, skip_bad_lines), listener)


def fold(rec: Recording, listener: Callable[[RunState], None] | None = None) -> RunState:
    """A read recording folded into a RunState (calling `listener(state)` after each event)."""
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
