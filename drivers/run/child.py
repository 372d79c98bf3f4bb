"""The driver process behind the UI: `python -m rampwatch.drivers.run.child`.

It reads its configuration from stdin, prepares the run (bad input goes back
as DriverFailed), then drives it, recording every event and streaming it to
stdout for the UI process. It has no UI and shares no lock or interpreter
with one, so a redraw can never delay a token's timestamp. Commands (mark,
stop) arrive on stdin; stdin closing means the UI is gone and the run stops
cleanly, as it does on the SIGTERM Linux sends when the UI process dies (see
lifetime). Exit code: the run's own (0, 1, 2, 3, 129, 130, 143).
"""

from __future__ import annotations

import sys

# The driver has no use for httpx's own command line, which httpx imports whenever click, Rich and Pygments are
# installed (Rich is, for the UI): ~50 ms and a UI library in the process that stamps tokens. A None entry makes
# that import fail the way httpx expects when they are absent (tests/test_layers.py holds the child to it).
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

import asyncio  # noqa: E402
import os  # noqa: E402

from rampwatch.drivers.run import event_loop, lifetime, pipe  # noqa: E402
from rampwatch.drivers.run.config import BadInput  # noqa: E402
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED  # noqa: E402
from rampwatch.drivers.run.runner import Run, crash_summary  # noqa: E402


async def serve(start: pipe.DriverStart, out_fd: int, pending: bytes = b"") -> int:
    loop = asyncio.get_running_loop()
    run = Run(start.config, record=start.record, fold=False)
    try:
        await run.prepare()
    except (BadInput, OSError) as e:
        await run.aclose()
        writer = await pipe.PipeWriter.open(out_fd)
        writer.send(pipe.DriverFailed(message=str(e)))
        await writer.close()
        return 2
    # Opened only now: its heartbeat must not come before the handshake (a probe can take seconds).
    writer = await pipe.PipeWriter.open(out_fd)
    writer.send(
        pipe.DriverReady(
            header=run.header(),
            clock_origin=run.clock.origin,
            recording=str(run.recording_path) if run.recording_path else None,
        )
    )
    run.hub.pipe = writer
    drive = asyncio.ensure_future(run.drive())

    def stop(sig: int | None) -> None:
        run.interrupt(drive, sig)

    def command(line: bytes) -> None:
        try:
            cmd = pipe.decode_command(line)
        except Exception:  # noqa: BLE001 - a garbled command is ignored, never fatal
            return
        if isinstance(cmd, pipe.Mark):
            run.mark(cmd.note)
        elif isinstance(cmd, pipe.Stop):
            stop(cmd.signal)

    lifetime.handle_stop_signals(loop, stop)
    await _listen(loop, command, on_eof=lambda: stop(None), pending=pending)
    try:
        code = await asyncio.shield(drive)
    except asyncio.CancelledError:
        code = await drive  # drive() turns its own cancellation into RunEnded(interrupted)
    await writer.close()
    return code


async def _listen(loop: asyncio.AbstractEventLoop, on_line, on_eof, pending: bytes) -> None:  # noqa: ANN001
    """Read commands from stdin as they come, on the run's loop."""
    splitter = pipe.LineSplitter(on_line)
    splitter.feed(pending)

    class _Commands(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            splitter.feed(data)

        def eof_received(self) -> bool:
            on_eof()
            return False

        def connection_lost(self, exc: Exception | None) -> None:
            on_eof()

    await loop.connect_read_pipe(_Commands, os.fdopen(0, "rb", buffering=0))


def main() -> int:
    lifetime.die_with_parent()  # SIGTERM (a clean stop, the file finished) when the UI process dies
    first, rest = pipe.first_line(0)
    try:
        start = pipe.decode_command(first)
    except Exception as e:  # noqa: BLE001
        print(f"rampwatch driver: bad start message: {crash_summary(e)}", file=sys.stderr)
        return 2
    if not isinstance(start, pipe.DriverStart):
        print("rampwatch driver: the first message must be the run's configuration", file=sys.stderr)
        return 2
    # The event stream owns the real stdout; anything else printed goes to stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        return event_loop.run(serve(start, out_fd, rest))
    except Exception as e:  # noqa: BLE001 - the UI turns this exit code into "crashed"
        print(f"rampwatch driver crashed: {crash_summary(e)}", file=sys.stderr)
        return EXIT_CRASHED


if __name__ == "__main__":
    sys.exit(main())
