"""Reading a trace: which format a file is, and its requests streamed in due order, sliced, each with its ideal
reuse. Bad input is one line naming the file, the line and the fix (BadInput: exit 2), or with `skip_bad` a
skip counted by reason.

Auto-detection reads the first line that is not blank: a JSON object whose `type` is `header` is a rampwatch
recording; one with `turns` is AIPerf multi_turn; with `requests`, agentic; with `chat_id`, Qwen-Bailian
JSONL; with `input_length`, `hash_ids` or `text_input`, Mooncake. A first line that opens a JSON value it does
not close is a whole-file agentic conversation; a comma-separated header naming `chat_id` is Qwen-Bailian CSV.
Every later row is held to the format found: one of another format is bad input (mixed formats).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rampwatch.drivers.model.events import TraceRun
from rampwatch.drivers.model.trace import BLOCK_SIZES, TRACE_FORMATS, BadRows, TraceProblem, TraceRequest
from rampwatch.drivers.model.trace_reuse import annotate_ideal
from rampwatch.drivers.model.trace_sessions import TraceRow, assemble
from rampwatch.drivers.model.trace_slice import SliceCounts, TraceSlice, slice_requests
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.trace_conversations import agentic_rows, aiperf_rows
from rampwatch.drivers.run.trace_file import first_line, json_object
from rampwatch.drivers.run.trace_recording import recording_block_size, recording_rows
from rampwatch.drivers.run.trace_rows import bailian_rows, mooncake_rows

RowReader = Callable[[Path, BadRows, int], Iterator[TraceRow]]

READERS: dict[str, RowReader] = {  # a recording's reader is also given the trace it replayed (requests())
    "mooncake": mooncake_rows,
    "bailian": bailian_rows,
    "agentic": agentic_rows,
    "aiperf": aiperf_rows,
    "rampwatch": recording_rows,
}

FORMAT_CHOICES = ("auto", *TRACE_FORMATS)

_UNKNOWN = (
    "not a trace format rampwatch knows (its first line has none of Mooncake's input_length/hash_ids, "
    "Qwen-Bailian's chat_id, agentic requests, AIPerf turns, nor a recording's header); name one with --format"
)


def detect_format(path: Path) -> str:
    """The format of the trace at `path`, from its first line that is not blank; BadInput when none fits."""
    first = first_line(path)
    if first is None:
        raise BadInput(f"{path}: empty file, not a trace")
    line = first[1].strip()
    obj = json_object(line)
    if obj is not None:
        if obj.get("type") == "header":
            return "rampwatch"
        for key, fmt in (("turns", "aiperf"), ("requests", "agentic"), ("chat_id", "bailian")):
            if key in obj:
                return fmt
        if any(key in obj for key in ("input_length", "hash_ids", "text_input")):
            return "mooncake"
    elif line.startswith((b"{", b"[")):
        return "agentic"
    elif b"chat_id" in (cell.strip().strip(b'"') for cell in line.split(b",")):
        return "bailian"
    raise BadInput(f"{path}: {_UNKNOWN}")


@dataclass(slots=True)
class TraceReading:
    """One trace file, ready to stream; `bad` and `slice_counts` hold what was left out once it has been."""

    path: Path
    format: str
    block_size: int
    bad: BadRows
    slice_counts: SliceCounts = field(default_factory=SliceCounts)
    notes: list[str] = field(default_factory=list)  # what the user should know of how it was read (once each)

    def requests(self, cut: TraceSlice | None = None, pool_tokens: int | None = None) -> Iterator[TraceRequest]:
        """The requests in due order, in their sessions, cut to `cut`, each with its ideal cached tokens
        (unbounded, and with an LRU pool of `pool_tokens`)."""
        if self.format == "rampwatch":
            rows = recording_rows(self.path, self.bad, self.block_size, self._replayed)
        else:
            rows = READERS[self.format](self.path, self.bad, self.block_size)
        requests = assemble(rows, self.block_size, self.bad)
        if cut is not None:
            requests = slice_requests(requests, cut, self.slice_counts)
        try:
            yield from annotate_ideal(requests, self.block_size, pool_tokens)
        except TraceProblem as problem:
            raise BadInput(f"{self.path}: {problem}") from None
        except (OSError, EOFError, zlib.error) as e:
            raise BadInput(f"cannot read {self.path}: {getattr(e, 'strerror', None) or e}") from None

    def _replayed(self, run: TraceRun) -> Iterator[TraceRequest] | None:
        """The requests of the trace a recorded run replayed, cut as the run cut them; None (and a note) when
        that trace is not at the path the recording names (relative to where the run was started)."""
        path = Path(run.path)
        cut = TraceSlice.of(run)
        try:  # the run read it whole before sending, skipping bad rows only where it was told to
            return open_trace(path, run.format, run.block_size, skip_bad=True).requests(cut)
        except BadInput:
            note = (
                f"{self.path} replayed {run.path}, which is not there: its turns' hash ids are derived (each session "
                "shares only its own prefix); run from where the replay was run to keep the prefixes they shared"
            )
            if note not in self.notes:
                self.notes.append(note)
            return None

    @property
    def skipped(self) -> dict[str, int]:
        """Everything left out so far, by reason: bad rows (skip_bad) and the slice."""
        return {**self.bad.counts, **self.slice_counts.counts}


def open_trace(
    path: str | Path, fmt: str = "auto", block_size: int | None = None, skip_bad: bool = False
) -> TraceReading:
    """A trace file checked and its format known (detected for `auto`); BadInput for a missing file, a
    directory or an unknown format. Nothing is read beyond the first line until `requests()` is iterated."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"no such trace: {path}")
    if path.is_dir():
        raise BadInput(f"not a trace (a directory): {path}")
    if fmt not in FORMAT_CHOICES:
        raise BadInput(f"unknown trace format {fmt!r} (choose from {', '.join(FORMAT_CHOICES)})")
    try:
        found = detect_format(path) if fmt == "auto" else fmt
    except (OSError, EOFError, zlib.error) as e:
        raise BadInput(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if block_size is not None and block_size < 1:
        raise BadInput(f"a block is at least one token: --block-size {block_size}")
    if block_size is None:
        block_size = recording_block_size(path) if found == "rampwatch" else BLOCK_SIZES[found]
    return TraceReading(path, found, block_size, BadRows(skip_bad))
