"""The UI process's handle on the driver process.

It starts `python -m rampwatch.drivers.run.child`, hands it the run's
configuration, and folds the event stream from its pipe into a RunState
that this process alone owns (live and replay share one code path: a live
run is a replay of a stream still being written). It sends marks and stop
requests, and turns an unexpected death of the driver into
RunEnded(crashed): in the state, so the UI shows it, and in the recording.
"""

from __future__ import annotations

import asyncio
import collections
import os
import select
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run import lifetime, pipe
from rampwatch.drivers.run.config import BadInput, RunConfig
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED, exit_reason

TRIM_EVERY = 1024  # event lines received between looks at how much of the run the recording holds
EXIT_WAIT_S = 30.0  # how long a stopping driver may take to cancel its turns and close the file
SILENT_AFTER_S = 3.0  # no event or heartbeat for this long: the driver is hung (it beats every second)


class DriverCrashed(Exception):
    """The driver process died before the run started; the message is one line."""


def describe_exit(code: int | None) -> str:
    return f"driver process {exit_reason(code)}"


class DriverProcess:
    """Start, follow, command and stop one driver process (see module doc)."""

    def __init__(self, cfg: RunConfig, record: bool = True):
        self.cfg, self.record = cfg, record
        self.state = RunState()
        self.clock = RunClock()
        self.recording: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr = tempfile.TemporaryFile()
        self._splitter = pipe.LineSplitter(self._on_line)
        # Event lines the recording may not hold yet, kept to restore what a killed driver had not written:
        # _unwritten[0] is event line number _unwritten_first (0-based). Lines on disk are dropped as it grows,
        # so this stays small (and grows only while the driver cannot write, e.g. a full disk).
        self._unwritten: collections.deque[bytes] = collections.deque()
        self._unwritten_first = 0
        self._file_read = 0  # bytes of the recording counted so far
        self._file_lines = 0  # whole lines among them (the header included)
        self._received = 0  # event lines received
        self._unread = 0  # lines received that the UI could not decode
        self.listeners: list[Callable[[ev.AnyEvent], None]] = []  # told each event after the state (the exporter)
        self._transport: asyncio.ReadTransport | None = None
        self._eof = False
        self._stopping = False  # stop() owns the driver and its pipe from here: the UI loop neither reads nor reaps
        self._heard = time.monotonic()  # when the driver last said anything

    # -- starting ----------------------------------------------------------------

    def start(self) -> None:
        """Start the driver and wait until its run is prepared. Raises BadInput
        (exit 2) or DriverCrashed (exit 3) before any UI opens."""
        # Terminal signals reach the UI, which decides; it ends with the UI process, however that ends.
        self.proc = lifetime.rampwatch_child("rampwatch.drivers.run.child", self._stderr)
        try:
            self._send(pipe.DriverStart(config=self.cfg, record=self.record))
            line, rest = self._handshake_line()
        except BaseException:
            self.proc.kill()  # e.g. Ctrl-C while the server is probed
            self.proc.wait()
            raise
        if not line:
            code = self.proc.wait()
            raise DriverCrashed(f"{describe_exit(code)} before the run started{self._stderr_tail()}")
        msg = pipe.decode_handshake(line)
        if isinstance(msg, pipe.DriverFailed):
            self.proc.wait()
            raise BadInput(msg.message)
        self.state = RunState(msg.header)
        self.clock = RunClock(msg.clock_origin)
        self.recording = Path(msg.recording) if msg.recording else None
        self._splitter.feed(rest)

    def _handshake_line(self) -> tuple[bytes, bytes]:
        assert self.proc is not None and self.proc.stdout is not None
        fd, data = self.proc.stdout.fileno(), b""
        while b"\n" not in data:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"", b""
            data += chunk
        line, _, rest = data.partition(b"\n")
        return line, rest

    # -- following the stream ----------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """Fold the stream into `state` as it arrives, on `loop` (the UI's)."""
        assert self.proc is not None and self.proc.stdout is not None
        owner = self

        class _Reader(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                if not owner._stopping:
                    owner._splitter.feed(data)

            def eof_received(self) -> bool:
                owner._on_eof()
                return False

        # A duplicate descriptor: the transport may close it, the original stays for stop()'s drain.
        stream = os.fdopen(os.dup(self.proc.stdout.fileno()), "rb", buffering=0)

        async def connect() -> None:
            self._transport, _ = await loop.connect_read_pipe(_Reader, stream)

        return asyncio.ensure_future(connect(), loop=loop)

    def _on_line(self, line: bytes) -> None:
        self._heard = time.monotonic()
        try:
            event = pipe.decode_stream(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._unreadable(line, e)
            return
        if isinstance(event, pipe.DriverAlive):
            return
        self._keep(line)
        self.state.apply(event)
        for listener in self.listeners:
            listener(event)

    def _keep(self, line: bytes) -> None:
        """Count an event line and keep it until the recording holds it."""
        self._received += 1
        self._unwritten.append(line)
        if self._received % TRIM_EVERY == 0:
            self._drop_written()

    def _unreadable(self, line: bytes, error: Exception) -> None:
        """A line the UI cannot decode is said on screen, never dropped in silence (the two sides disagree on the
        format: another rampwatch version?). It is still counted: the driver recorded it too."""
        self._keep(line)
        self._unread += 1
        if self._unread in (1, 10, 100, 1000, 10000):
            what = "a line" if self._unread == 1 else f"{self._unread} lines"
            self.state.apply(
                ev.Notice(
                    t=self.state.raw_t,
                    level="error",
                    message=(
                        f"the UI could not read {what} of the driver's stream ({str(error)[:120]}); the recording has "
                        f"them: replay it with a rampwatch of the driver's version"
                    ),
                )
            )

    def _events_on_disk(self) -> int:
        """Event lines the recording holds now, counted from the bytes appended since the last look."""
        if self.recording is not None:
            try:
                with open(self.recording, "rb") as f:
                    f.seek(self._file_read)
                    data = f.read()
            except OSError:
                data = b""
            whole = data.rfind(b"\n") + 1
            self._file_read += whole
            self._file_lines += data.count(b"\n", 0, whole)
        return max(0, self._file_lines - 1)

    def _drop_written(self) -> None:
        on_disk = self._events_on_disk()
        while self._unwritten and self._unwritten_first < on_disk:
            self._unwritten.popleft()
            self._unwritten_first += 1

    def _on_eof(self) -> None:
        """The driver closed its end: it finished, or it died."""
        self._eof = True
        self._await_exit(time.monotonic() + 5.0)

    def _await_exit(self, deadline: float) -> None:
        """On the UI loop, without blocking it: once the driver has exited (or,
        still there at the deadline, been killed), say it crashed unless it ended."""
        assert self.proc is not None
        if self.state.ended is not None or self._stopping:
            return
        if self.proc.poll() is None and time.monotonic() < deadline:
            asyncio.get_running_loop().call_later(0.05, self._await_exit, deadline)
            return
        self._reap(wait=0.0)

    def _reap(self, wait: float) -> None:
        """Wait for the driver to exit; if it ended without RunEnded, say it crashed."""
        assert self.proc is not None
        try:
            why = describe_exit(self.proc.wait(timeout=wait))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            why = "driver process hung (it did not stop when asked) and was killed"
        if self.state.ended is None:
            self._crashed(why)
        else:  # a driver that could not write its last events (a full disk) leaves them to the UI's copy
            self._complete_recording(None)

    def _crashed(self, why: str) -> None:
        end = ev.RunEnded(t=max(self.state.raw_t, self.clock()), status="crashed", exit_code=EXIT_CRASHED, error=why)
        self.state.apply(end)
        self._complete_recording(end)

    def _complete_recording(self, end: ev.RunEnded | None) -> None:
        """After the driver exited: cut a torn last line, append the events the
        UI received that never reached the file, then the crash (`end`) if it crashed."""
        path = self.recording
        if path is None:
            return
        try:
            with open(path, "r+b") as f:
                data = f.read()
                whole = data.rfind(b"\n") + 1
                in_file = max(0, data.count(b"\n", 0, whole) - 1)  # the header is the first line
                skip = in_file - self._unwritten_first
                lines = list(self._unwritten)[skip:] if skip >= 0 else []
                if end is not None:
                    lines.append(pipe.encode(end))
                if lines or whole < len(data):
                    f.truncate(whole)
                    f.seek(whole)
                    f.write(b"".join(line + b"\n" for line in lines))
        except OSError:
            pass  # the UI still shows the run's end; the file stays readable up to its last whole line

    # -- commands ----------------------------------------------------------------

    def _send(self, message: object) -> bool:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            return False
        try:
            proc.stdin.write(pipe.encode(message) + b"\n")
            proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def mark(self, note: str) -> bool:
        return self.state.ended is None and self._send(pipe.Mark(note=note))

    def stop(self, sig: int | None = None, wait: float = EXIT_WAIT_S) -> int:
        """Stop the run (if still going), read the stream to its end (at most
        `wait` seconds), and return the run's exit code. Called once the UI
        loop is done."""
        if self.proc is None:
            return EXIT_CRASHED
        self._stopping = True
        if self.state.ended is None:
            self._send(pipe.Stop(signal=sig))
        if self._transport is not None:
            self._transport.pause_reading()
        self._drain(time.monotonic() + wait)
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._reap(wait=0.0 if self.state.ended is None and not self._eof else 5.0)
        assert self.state.ended is not None
        return self.state.ended.exit_code

    def _drain(self, deadline: float) -> None:
        """Read what is left on the pipe, up to EOF or the deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        if self._eof:
            return
        fd = self.proc.stdout.fileno()
        os.set_blocking(fd, True)  # the UI loop's transport had made it non-blocking
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._eof = True
                return
            self._splitter.feed(chunk)

    # -- what the driver said on stderr ------------------------------------------

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def _stderr_tail(self) -> str:
        lines = [line for line in self.stderr_text().splitlines() if line.strip()]
        return f": {lines[-1].strip()}" if lines else ""

    @property
    def finished(self) -> bool:
        return self.state.ended is not None

    def silent_for(self) -> float | None:
        """Seconds the running driver has said nothing, when that is long enough to mean it hangs."""
        if self.finished:
            return None
        quiet = time.monotonic() - self._heard
        return quiet if quiet >= SILENT_AFTER_S else None

    def now(self) -> float:
        return self.state.ended.t if self.state.ended else self.state.modelled_time(self.clock())
