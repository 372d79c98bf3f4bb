"""A driver worker on this machine (--workers N): `python -m rampwatch.drivers.run.worker`, reached over its
stdin/stdout (workers.WorkerLink), which dies with rampwatch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from collections.abc import Callable

from rampwatch.drivers.run import lifetime, pipe
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.exitcodes import exit_reason


class LocalWorker:
    """A worker process on this machine: `python -m rampwatch.drivers.run.worker`, which dies with this one."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr = tempfile.TemporaryFile()

    def spawn(self) -> LocalWorker:
        """Start its process, which imports what it runs and then waits for its start message: spawned while the
        run prepares (probing the server, calibrating), the imports are done by the time the workers start."""
        if self.proc is None:  # Ctrl-C reaches the coordinator, which stops the workers
            self.proc = lifetime.rampwatch_child("rampwatch.drivers.run.worker", self._stderr)
        return self

    def start(self, message: ww.WorkerStart, on_line: Callable[[bytes], None], on_exit: Callable[[str], None]) -> None:
        proc = self.spawn().proc
        assert proc is not None
        self.send(message)
        loop = asyncio.get_running_loop()
        splitter = pipe.LineSplitter(on_line)

        def exited() -> None:
            if proc.poll() is None:
                loop.call_later(0.02, exited)
            else:
                on_exit(exit_reason(proc.returncode))

        class _Reader(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                splitter.feed(data)

            def connection_lost(self, exc: Exception | None) -> None:
                exited()

        assert proc.stdout is not None
        stream = os.fdopen(os.dup(proc.stdout.fileno()), "rb", buffering=0)
        proc.stdout.close()
        asyncio.ensure_future(loop.connect_read_pipe(_Reader, stream))

    def send(self, message: object) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            return
        try:
            proc.stdin.write(ww.encode(message) + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # it is dying: its exit says so

    def kill(self) -> None:
        """SIGKILL, without waiting on the loop (it is reaped by its exit watch, or by lifetime at exit): a worker
        here has been asked to stop and waited for already."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def discard(self) -> None:
        """End a process spawned for a start that never came (it waits on its start message: it ends at once)
        and close its pipes."""
        proc = self.proc
        if proc is not None:
            self.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        self._stderr.close()

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = [ln for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""
