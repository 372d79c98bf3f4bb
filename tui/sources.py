"""What feeds the UI: a live run's event stream from its driver process, or
a recording played back at any speed. Both fold events into a RunState that
the UI process alone owns, and expose a clock; the app reads them on its
timer, with no lock (everything runs on the UI's event loop)."""

from __future__ import annotations

import asyncio
import bisect
import time
from datetime import datetime
from pathlib import Path

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.process import DriverProcess
from rampwatch.drivers.run.recording import Recording, decode_event, read_recording

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class LiveSource:
    """A live run: the driver runs in its own process (DriverProcess) and the
    UI folds its event stream into a RunState that only the UI owns."""

    def __init__(self, driver: DriverProcess):
        self.driver = driver

    @property
    def state(self) -> RunState:
        return self.driver.state

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.driver.attach(loop)

    @property
    def finished(self) -> bool:
        return self.driver.finished

    def now(self) -> float:
        return self.driver.now()

    def mode(self) -> str:
        ended = self.state.ended
        if ended is not None:
            return f"{self.driver.cfg.mode} · {ended.status}"
        mode = {"watch": "watch", "demo": "demo · SIMULATED"}.get(self.driver.cfg.mode, "live")
        silent = self.driver.silent_for()
        return mode if silent is None else f"{mode} · driver silent {silent:.0f}s"

    def recording(self) -> str | None:
        return str(self.driver.recording) if self.driver.recording else None

    def tick(self, dt: float) -> None:
        pass

    def mark(self, note: str) -> bool:
        return self.driver.mark(note)

    def stop(self, sig: int | None = None) -> int:
        """Stop the driver (cancelled turns recorded, file closed) and return the
        exit code. `sig`: the signal that ended the UI, None when the user quit."""
        code = self.driver.stop(sig)
        if (
            sig is None
            and self.driver.cfg.mode == "watch"
            and self.state.ended
            and self.state.ended.status == "interrupted"
        ):
            return 0  # quitting is how watching ends
        return code


class ReplaySource:
    """Plays a recording into a fresh RunState: pause, speed, step and seek.
    Seeking back rebuilds the state from the start (folding is cheap)."""

    def __init__(self, recording: Recording, speed: float = 1.0):
        self.header = recording.header
        self.events = recording.events
        self.times = [e.t for e in self.events]
        self.end_t = max(self.times, default=0.0)
        self.turn_marks: list[float] = []  # request times; sessions sent within half a second share one
        for t in sorted(e.t for e in self.events if isinstance(e, ev.RequestSent)):
            if not self.turn_marks or t - self.turn_marks[-1] > 0.5:
                self.turn_marks.append(t)
        self.speed = speed
        self.paused = False
        self.position = 0.0
        self._next = 0
        self.state = RunState(recording.header)

    # -- playback --------------------------------------------------------------

    def _apply_until(self, t: float) -> None:
        events, state = self.events, self.state
        while self._next < len(events) and events[self._next].t <= t:
            state.apply(events[self._next])
            self._next += 1

    def seek(self, t: float) -> None:
        t = min(max(0.0, t), self.end_t)
        if t < self.position:
            self.state = RunState(self.header)
            self._next = 0
        self.position = t
        self._apply_until(t)

    def tick(self, dt: float) -> None:
        if self.paused or self.position >= self.end_t:
            return
        self.seek(self.position + dt * self.speed)

    def step(self) -> None:
        """Jump to the next event and pause there."""
        self.paused = True
        if self._next < len(self.events):
            self.seek(self.events[self._next].t)

    def seek_turn(self, direction: int) -> None:
        marks = self.turn_marks
        if direction > 0:
            i = bisect.bisect_right(marks, self.position + 1e-9)
            self.seek(marks[i] if i < len(marks) else self.end_t)
        else:
            i = bisect.bisect_left(marks, self.position - 1e-9) - 1
            self.seek(marks[i] if i >= 0 else 0.0)

    def change_speed(self, direction: int) -> None:
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self.speed))
        self.speed = SPEEDS[min(len(SPEEDS) - 1, max(0, i + direction))]

    # -- what the app reads ---------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.position >= self.end_t

    def now(self) -> float:
        return self.state.modelled_time(self.position)

    def mode(self) -> str:
        state = "paused" if self.paused else ("end" if self.finished else "playing")
        return f"replay {self.speed:g}x {state}"

    def recording(self) -> str | None:
        return None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        pass  # the whole recording is in memory

    def mark(self, note: str) -> bool:
        return False


class FollowSource:
    """A run as its recording grows: what each browser page of `--web` shows.
    Every tick reads the lines appended since the last (the driver flushes
    its recording every half second), so any number of pages follow one run, and the
    page's process holds nothing but the recording's path."""

    def __init__(self, path: Path):
        self.path = path
        rec = read_recording(path)  # the header and whatever is there already
        self.state = RunState(rec.header)
        for e in rec.events:
            self.state.apply(e)
        self._read = self._whole_lines_size()
        self._partial = b""
        try:
            self._origin = datetime.fromisoformat(rec.header.started_at).timestamp()
        except ValueError:
            self._origin = time.time() - self.state.t

    def _whole_lines_size(self) -> int:
        data = self.path.read_bytes()
        return data.rfind(b"\n") + 1

    def tick(self, dt: float) -> None:
        if self.state.ended is not None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self._read)
                data = f.read()
        except OSError:
            return
        self._read += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line.strip():
                try:
                    self.state.apply(decode_event(line))
                except msgspec.DecodeError:
                    pass  # a line torn by a crash: the next whole one follows

    @property
    def finished(self) -> bool:
        return self.state.ended is not None

    def now(self) -> float:
        ended = self.state.ended
        wall = self.state.modelled_time(time.time() - self._origin)
        return ended.t if ended is not None else max(self.state.t, wall)

    def mode(self) -> str:
        header = self.state.header
        kind = header.mode if header else "run"
        ended = self.state.ended
        return f"{kind} · {ended.status}" if ended else f"{kind} · live (web)"

    def recording(self) -> str | None:
        return str(self.path)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def mark(self, note: str) -> bool:
        return False  # a page watches; marks belong to whoever runs the ramp
