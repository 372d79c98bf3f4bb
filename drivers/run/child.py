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

from rampwatch.drivers.run import lifetime, pipe  # noqa: E402
from rampwatch.drivers.run.config import BadInput  # noqa: E402
from rampwatch.drivers.run.runner import Run  # noqa: E402


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
    await pipe.listen(loop, command, on_eof=lambda: stop(None), pending=pending)
    try:
        code = await asyncio.shield(drive)
    except asyncio.CancelledError:
        code = await drive  # drive() turns its own cancellation into RunEnded(interrupted)
    await writer.close()
    return code


def main() -> int:
    # SIGTERM (a clean stop, the file finished) when the UI process dies
    return pipe.child_main("driver", pipe.decode_command, pipe.DriverStart, "the run's configuration", serve)


if __name__ == "__main__":
    sys.exit(main())
