"""The event hub: every event goes to the recorder, the RunState and any listeners.

Emitting happens on the driver's event loop; the UI (another thread) reads
the state under `lock`, so it always sees whole events applied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from drivers import events as ev
from drivers.recording import Recorder
from drivers.state import RunState


class EventHub:
    def __init__(self, state: RunState, recorder: Recorder | None = None, keep_events: bool = True):
        self.state = state
        self.recorder = recorder
        self.lock = threading.Lock()
        self.events: list[ev.AnyEvent] = []
        self.keep_events = keep_events
        self.listeners: list[Callable[[ev.AnyEvent], None]] = []
        self._reported_recording_error = False

    def emit(self, e: ev.AnyEvent) -> None:
        with self.lock:
            if self.keep_events:
                self.events.append(e)
            self.state.apply(e)
        rec = self.recorder
        if rec is not None:
            rec.write(e)
            if rec.error is not None and not self._reported_recording_error:
                self._report_recording_error(e.t, rec.error)
        for listener in self.listeners:
            listener(e)

    def flush(self) -> None:
        rec = self.recorder
        if rec is not None:
            rec.flush()
            if rec.error is not None and not self._reported_recording_error:
                self._report_recording_error(self.state.t, rec.error)

    def _report_recording_error(self, t: float, message: str) -> None:
        self._reported_recording_error = True
        with self.lock:
            self.state.recording_error = message
        self.emit(ev.Notice(t=t, level="error", message=f"{message}; the run goes on in memory"))
