"""The event hub: every event goes to the recorder, the RunState and any listeners.

Emitting happens on the driver's event loop; the UI (another thread) reads
the state under `lock`, so it always sees whole events applied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import Recorder
from rampwatch.drivers.model.state import RunState


class EventHub:
    def __init__(self, state: RunState, recorder: Recorder | None = None, keep_events: bool = False):
        """`keep_events`: also keep every event in memory (tests and benchmarks
        count them); a live run leaves that to the recording, so memory stays flat."""
        self.state = state
        self.recorder = recorder
        self.lock = threading.Lock()
        self.events: list[ev.AnyEvent] = []
        self.keep_events = keep_events
        self.listeners: list[Callable[[ev.AnyEvent], None]] = []
        self._recording_error: str | None = None

    def emit(self, e: ev.AnyEvent) -> None:
        with self.lock:
            if self.keep_events:
                self.events.append(e)
            self.state.apply(e)
        if self.recorder is not None:
            self.recorder.write(e)
            self._check_recorder(e.t)
        for listener in self.listeners:
            listener(e)

    def flush(self, force: bool = False) -> None:
        """Write what is pending (`force`: retry a failed disk now, e.g. before the run's last event)."""
        if self.recorder is not None:
            self.recorder.flush(force)
            self._check_recorder(self.state.t)

    def _check_recorder(self, t: float) -> None:
        """Say it loudly, once, when the recording stops or comes back."""
        rec = self.recorder
        assert rec is not None
        if rec.error is not None and self._recording_error is None:
            self._recording_error = rec.error
            with self.lock:
                self.state.recording_error = rec.error
            self.emit(ev.Notice(t=t, level="error", message=f"{rec.error}; events are kept in memory until it can write"))
        elif rec.error is None and self._recording_error is not None:
            self._recording_error = None
            with self.lock:
                self.state.recording_error = None
            self.emit(ev.Notice(t=t, level="info", message=f"recording resumed; nothing was lost ({rec.path})"))
