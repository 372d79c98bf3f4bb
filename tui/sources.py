"""What feeds the UI: a live run on its own driver thread, or a recording
played back at any speed. Both expose a RunState (read under `lock`) and a
clock; the app only reads them on its timer."""

from __future__ import annotations

import asyncio
import bisect
import threading
from typing import Any

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import Recording
from rampwatch.drivers.run.runner import BadInput, Run
from rampwatch.drivers.model.state import RunState

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class LiveSource:
    """Runs `run.prepare()` and `run.drive()` on a thread with its own event
    loop, so token timestamps never wait for a redraw."""

    def __init__(self, run: Run):
        self.run = run
        self.state = run.state
        self.lock = run.hub.lock
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self._prepared = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.thread = threading.Thread(target=self._main, name="rampwatch-driver", daemon=True)

    def start(self) -> None:
        """Start the driver; raises BadInput (before any UI) when the run cannot start."""
        self.thread.start()
        self._prepared.wait()
        if self.error is not None:
            self.thread.join()
            raise self.error

    def _main(self) -> None:
        asyncio.run(self._amain())

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        try:
            await self.run.prepare()
        except (BadInput, OSError) as e:
            self.error = e
            await self.run.aclose()
            self._prepared.set()
            return
        self._prepared.set()
        self.exit_code = await self.run.drive()

    @property
    def finished(self) -> bool:
        return self.exit_code is not None

    def now(self) -> float:
        return self.state.ended.t if self.state.ended else self.run.clock()

    def mode(self) -> str:
        if self.state.ended:
            return f"{self.run.cfg.mode} · {self.state.ended.status}"
        return {"watch": "watch", "demo": "demo · SIMULATED"}.get(self.run.cfg.mode, "live")

    def recording(self) -> str | None:
        p = self.run.recording_path
        return str(p) if p else None

    def tick(self, dt: float) -> None:
        pass

    def mark(self, note: str) -> bool:
        if self._loop is None or self.finished:
            return False
        self._loop.call_soon_threadsafe(self.run.mark, note)
        return True

    def stop(self, sig: int | None = None) -> int:
        """Cancel the sessions, close the recording, wait for the driver.
        `sig`: the signal that ended the UI, None when the user quit."""
        if self._loop is not None and self._task is not None and not self.finished:
            self.run.interrupted_by = sig
            self._loop.call_soon_threadsafe(self._task.cancel)
        self.thread.join(timeout=30)
        if sig is None and self.run.cfg.mode == "watch":
            return 0  # quitting is how watching ends
        return self.exit_code if self.exit_code is not None else 130


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
        self.lock = threading.Lock()
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
        with self.lock:
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
        return self.position

    def mode(self) -> str:
        state = "paused" if self.paused else ("end" if self.finished else "playing")
        return f"replay {self.speed:g}x {state}"

    def recording(self) -> str | None:
        return None

    def mark(self, note: str) -> bool:
        return False
