"""Recordings: a header line, then one JSON event per line, appended as it happens.

The writer flushes at least every second, so a run killed at any moment
leaves a file that replays up to its last complete line. A write that fails
(disk full, file gone) is reported once and the run goes on in memory.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from rampwatch.drivers.model.events import SCHEMA, AnyEvent, Header

_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(Header)
_event_decoder = msgspec.json.Decoder(AnyEvent)


class RecordingError(Exception):
    """A file that cannot be read as a recording; the message is one line for the user."""


class Recorder:
    """Appends a run's events to its file: batched, flushed at least once a
    second, never a torn line, and loud (not fatal) when the disk fills."""

    FLUSH_EVERY = 0.5  # seconds; the bar is at least once a second
    RETRY_EVERY = 5.0  # after a failed write (disk full), try again this often

    def __init__(self, path: Path, header: Header):
        self.path = path
        self.error: str | None = None  # set while writes fail; the lines wait in memory
        self.resumed = 0  # times writing came back after a failure
        self._pending: list[bytes] = []
        self._last_flush = time.monotonic()
        self._file = open(path, "xb", buffering=0)  # never clobber an earlier run; unbuffered: we batch
        self._size = 0
        self._append(_encoder.encode(header) + b"\n")

    @staticmethod
    def check_path(path: Path) -> str | None:
        """Why `path` cannot take a new recording, or None."""
        if path.is_dir():
            return f"recording path is a directory: {path}"
        if path.exists():
            return f"recording already exists (choose another --record path): {path}"
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            return f"recording folder does not exist: {parent}"
        if not os.access(parent, os.W_OK):
            return f"recording folder is not writable: {parent}"
        return None

    def _append(self, data: bytes) -> None:
        """Write all of `data` or none of it: a failed write is cut back to the
        last whole line, so a later retry never leaves a torn line behind."""
        view = memoryview(data)
        try:
            while view:
                n = self._file.write(view)
                view = view[n or 0 :]
        except OSError:
            try:
                self._file.truncate(self._size)
                self._file.seek(self._size)
            except OSError:
                pass
            raise
        self._size += len(data)

    @property
    def pending(self) -> list[bytes]:
        """Lines written to memory but not yet to the file."""
        return self._pending

    def write(self, event: AnyEvent) -> None:
        self.write_line(_encoder.encode(event))

    def write_line(self, line: bytes, flush: bool | None = None) -> None:
        """Queue one encoded event (no newline); written at the next flush, which is
        now when `flush` says so (None: when FLUSH_EVERY has passed)."""
        self._pending.append(line)
        if self.flush_due() if flush is None else flush:
            self.flush()

    def flush_due(self) -> bool:
        """Whether the next `write_line` writes to the file."""
        return time.monotonic() - self._last_flush >= self.FLUSH_EVERY

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.error is not None and not force and now - self._last_flush < self.RETRY_EVERY:
            return
        self._last_flush = now
        if not self._pending:
            return
        data = b"\n".join(self._pending) + b"\n"
        try:
            self._append(data)
        except OSError as e:
            # Keep the lines: they are written when the disk has room again.
            self.error = f"recording paused: {e.strerror or e} ({self.path})"
            return
        if self.error is not None:
            self.error = None
            self.resumed += 1
        self._pending.clear()

    async def drain(self, wait_s: float) -> None:
        """A full disk at the end of a run: the events still in memory wait for room (`wait_s` at most, saying
        so once) rather than being dropped at exit; the UI, which has them too, appends what is still missing
        once the driver has exited."""
        self.flush(force=True)
        if self.error is None:
            return
        print(
            f"rampwatch: {self.error}; waiting up to {wait_s:.0f} s for room to write the run's last "
            f"{len(self.pending)} events",
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + wait_s
        while self.error is not None and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            self.flush(force=True)

    def close(self) -> None:
        self.flush(force=True)  # a last try, whatever the retry clock says
        try:
            self._file.close()
        except OSError as e:
            self.error = self.error or f"recording not closed cleanly: {e.strerror or e}"


class Recording(msgspec.Struct):
    header: Header
    events: list[AnyEvent]
    truncated_tail: bool = False  # the last line was cut off (a killed run)
    skipped_lines: list[int] = []


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if line.strip():
            yield i + 1, line, i == last  # the final piece has no newline after it


def decode_event(line: bytes) -> AnyEvent:
    """One recording line after the header (msgspec.DecodeError if it is not an event)."""
    return _event_decoder.decode(line)


def read_recording(path: str | Path, skip_bad_lines: bool = False) -> Recording:
    path = Path(path)
    if not path.exists():
        raise RecordingError(f"no such recording: {path}")
    if path.is_dir():
        raise RecordingError(f"not a recording (a directory): {path}")
    try:
        lines = _lines(path)
        first = next(lines, None)
    except OSError as e:
        raise RecordingError(f"cannot read {path}: {e.strerror or e}") from None
    if first is None:
        raise RecordingError(f"empty file, not a recording: {path}")
    try:
        raw = msgspec.json.decode(first[1])
    except msgspec.DecodeError:
        raw = None
    if not isinstance(raw, dict) or raw.get("type") != "header":
        raise RecordingError(f"not a rampwatch recording: {path}")
    schema = raw.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA:
        raise RecordingError(
            f"{path} is a recording of schema {schema}; this rampwatch reads schema {SCHEMA} (upgrade rampwatch)"
        )
    try:
        header = _header_decoder.decode(first[1])
    except msgspec.DecodeError as e:
        raise RecordingError(f"{path}:1: bad header: {e}") from None
    events: list[AnyEvent] = []
    skipped: list[int] = []
    truncated = False
    for number, line, is_last in lines:
        try:
            events.append(_event_decoder.decode(line))
        except msgspec.DecodeError as e:
            if is_last:
                truncated = True  # a run killed mid-write: keep all complete lines
            elif skip_bad_lines:
                skipped.append(number)
            else:
                raise RecordingError(
                    f"{path}:{number}: corrupt line ({e}); use --skip-bad-lines to read past it"
                ) from None
    return Recording(header=header, events=events, truncated_tail=truncated, skipped_lines=skipped)
