"""The event hub: every event is encoded once and goes to the recording and
the pipe to the UI process as the same bytes, is folded into this process's
RunState when it keeps one, and is handed to any listeners.

Everything here runs on the driver's event loop: nothing is shared with a
renderer, so nothing is locked.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.recording import Recorder

_encode = msgspec.json.Encoder().encode


class LineSink(Protocol):
    def write_line(self, line: bytes) -> None: ...

    def flush(self) -> None: ...


class EventHub:
    """Fans each event out to the recorder, the pipe, the state and listeners."""

    def __init__(self, state: RunState | None, recorder: Recorder | None = None, keep_events: bool = False):
        """`keep_events`: also keep every event in memory (tests and benchmarks
        count them); a live run leaves that to the recording, so memory stays flat."""
        self.state = state
        self.recorder = recorder
        self.pipe: LineSink | None = None
        self.events: list[ev.AnyEvent] = []
        self.keep_events = keep_events
        self.listeners: list[Callable[[ev.AnyEvent], None]] = []
        self.t = 0.0  # the newest event's time: when the hub's own notices happened
        self._recording_error: str | None = None
        # With workers, events are held back until `release`, so those arriving from several processes go out in
        # time order (see hold).
        self._holding = False
        self._held: list[tuple[float, int, ev.AnyEvent, bytes | None]] = []
        self._seq = 0

    def hold(self) -> None:
        """From now on keep each event until release() passes its time: the coordinator of --workers N hears each
        worker's events a batch at a time (tens of ms late; seconds, when it falls behind), and merges them in
        time order with its own (as far as every worker has sent its own: spread.py)."""
        self._holding = True

    def release(self, upto: float = float("inf")) -> None:
        """Send on every held event up to time `upto`, in time order (inf: all, and hold no more)."""
        held = self._held
        while held and held[0][0] <= upto:
            _, _, e, line = heapq.heappop(held)
            self._deliver(e, line)
        if upto == float("inf"):
            self._holding = False

    def emit(self, e: ev.AnyEvent, line: bytes | None = None) -> None:
        """`line`: the event already encoded (a worker's, as it sent it), so it is not encoded again."""
        if self._holding:
            self._seq += 1
            heapq.heappush(self._held, (e.t, self._seq, e, line))
            return
        self._deliver(e, line)

    def _deliver(self, e: ev.AnyEvent, line: bytes | None = None) -> None:
        self.t = max(self.t, e.t)
        if self.keep_events:
            self.events.append(e)
        if self.state is not None:
            self.state.apply(e)
        if self.recorder is not None or self.pipe is not None:
            line = line or _encode(e)
            # The pipe first, and flushed before the file is written: a driver killed at any moment leaves the
            # UI holding every event the file holds (in the file's order), so it can restore the rest; unless
            # the UI had fallen more than the OS pipe's buffer behind (the file is never held back for a UI).
            if self.pipe is not None:
                self.pipe.write_line(line)
            if self.recorder is not None:
                due = self.recorder.flush_due()
                if due and self.pipe is not None:
                    self.pipe.flush()
                self.recorder.write_line(line, flush=due)
                self._check_recorder(e.t)
        for listener in self.listeners:
            listener(e)

    def flush(self, force: bool = False) -> None:
        """Write what is pending (`force`: retry a failed disk now, e.g. before the run's last event)."""
        if self.pipe is not None:
            self.pipe.flush()  # never the file ahead of the UI
        if self.recorder is not None:
            self.recorder.flush(force)
            self._check_recorder(self.t)

    def _check_recorder(self, t: float) -> None:
        """Say it loudly, once, when the recording stops or comes back."""
        rec = self.recorder
        assert rec is not None
        if rec.error is not None and self._recording_error is None:
            self._recording_error = rec.error
            self.emit(
                ev.Notice(
                    t=t,
                    level="error",
                    topic="recording",
                    message=f"{rec.error}; events are kept in memory until it can write",
                )
            )
        elif rec.error is None and self._recording_error is not None:
            self._recording_error = None
            self.emit(
                ev.Notice(
                    t=t, level="info", topic="recording", message=f"recording resumed; nothing was lost ({rec.path})"
                )
            )
