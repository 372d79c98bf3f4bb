"""The stream between the driver process and the UI process.

Driver -> UI (the driver's stdout): one JSON message per line. First either
DriverReady (the run's header, recording path and clock origin) or
DriverFailed (bad input found while preparing, one line for the user); then
the run's events, byte for byte as the recording has them, and a DriverAlive
heartbeat in each second that had nothing else to say (never recorded), so
a hung driver is told apart from a quiet run.

UI -> driver (the driver's stdin): the run's configuration as the first
line, then commands, one per line: Mark, Stop. End of input means the UI is
gone: the driver stops the run cleanly.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePath
from typing import Any

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig

FLUSH_EVERY_S = 0.05  # events wait at most this long in the driver: the UI redraws at 10 Hz anyway
HEARTBEAT_S = 1.0


class DriverStart(msgspec.Struct, tag="start"):
    config: RunConfig
    record: bool = True


class DriverReady(msgspec.Struct, tag="ready"):
    header: ev.Header
    clock_origin: float  # the driver's time.perf_counter() at t = 0 (a system-wide clock)
    recording: str | None = None


class DriverFailed(msgspec.Struct, tag="failed"):
    message: str
    exit_code: int = 2


class DriverAlive(msgspec.Struct, tag="alive"):
    """The driver's loop is turning; sent only in seconds without events."""


class Mark(msgspec.Struct, tag="mark"):
    note: str


class Stop(msgspec.Struct, tag="stop"):
    signal: int | None = None  # the signal that ended the UI; None: the user quit


Command = DriverStart | Mark | Stop
Handshake = DriverReady | DriverFailed


def enc_hook(obj: Any) -> Any:
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, range):  # a trace's derived hash ids (model/trace.py), handed to a worker
        return list(obj)
    raise NotImplementedError(f"cannot send {type(obj).__name__}")


def dec_hook(kind: type, obj: Any) -> Any:
    if kind is Path:
        return Path(obj)
    raise NotImplementedError(f"cannot receive {kind}")


encode = msgspec.json.Encoder(enc_hook=enc_hook).encode
decode_command = msgspec.json.Decoder(Command, dec_hook=dec_hook).decode
decode_handshake = msgspec.json.Decoder(Handshake).decode
decode_stream = msgspec.json.Decoder(ev.AnyEvent | DriverAlive).decode


class PipeWriter:
    """Event lines to the UI without ever blocking the driver's loop: lines are
    batched for FLUSH_EVERY_S and written through a non-blocking pipe
    transport (which buffers if the UI is slow). A UI that went away makes
    the pipe a no-op, never an error in the run."""

    def __init__(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop, heartbeat: bool = True):
        self.transport, self.loop = transport, loop
        self._pending: list[bytes] = []
        self.broken = False
        self._wrote = False  # anything written since the last heartbeat check
        self._heartbeat = loop.call_later(HEARTBEAT_S, self._beat) if heartbeat else None

    @classmethod
    async def open(cls, fd: int, heartbeat: bool = True) -> PipeWriter:
        """`heartbeat`: a DriverAlive in each quiet second (the UI tells a hung driver from a quiet run by it)."""
        loop = asyncio.get_running_loop()
        holder: list[PipeWriter] = []

        class _Proto(asyncio.BaseProtocol):
            def connection_lost(self, exc: Exception | None) -> None:
                if holder:
                    holder[0].broken = True

        transport, _ = await loop.connect_write_pipe(_Proto, os.fdopen(fd, "wb", buffering=0))
        writer = cls(transport, loop, heartbeat)  # type: ignore[arg-type]
        holder.append(writer)
        return writer

    def _beat(self) -> None:
        if not self._wrote and not self.broken:
            self.send(DriverAlive())
        self._wrote = False
        self._heartbeat = self.loop.call_later(HEARTBEAT_S, self._beat)

    def write_line(self, line: bytes) -> None:
        if self.broken:
            return
        self._wrote = True
        if not self._pending:
            self.loop.call_later(FLUSH_EVERY_S, self.flush)
        self._pending.append(line)

    def send(self, message: msgspec.Struct) -> None:
        """A control message, written at once (the handshake)."""
        self.write_line(encode(message))
        self.flush()

    def flush(self) -> None:
        if self._pending and not self.broken and not self.transport.is_closing():
            self._pending.append(b"")
            self.transport.write(b"\n".join(self._pending))
        self._pending = []

    async def close(self) -> None:
        """Write what is left and wait until the UI has it (or is gone)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self.flush()
        for _ in range(200):  # at most ~2 s for a UI that stopped reading
            if self.broken or self.transport.get_write_buffer_size() == 0:
                break
            await asyncio.sleep(0.01)
        self.transport.close()


class LineSplitter:
    """Bytes in, whole lines out (the last partial line waits for more)."""

    def __init__(self, on_line: Callable[[bytes], None]):
        self.on_line = on_line
        self._rest = b""

    def feed(self, data: bytes) -> None:
        data = self._rest + data if self._rest else data
        *lines, self._rest = data.split(b"\n")
        for line in lines:
            if line:
                self.on_line(line)


def first_line(fd: int) -> tuple[bytes, bytes]:
    """The first line on `fd` and whatever followed it in the same reads
    (unbuffered, so no later command is swallowed by a reader's buffer)."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    first, _, rest = data.partition(b"\n")
    return first, rest


async def listen(
    loop: asyncio.AbstractEventLoop, on_line: Callable[[bytes], None], on_eof: Callable[[], None], pending: bytes
) -> None:
    """Read commands from stdin as they come, on the run's loop (`pending`: what came with the first line);
    `on_eof()` once the other end is gone."""
    splitter = LineSplitter(on_line)
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


def child_main(
    name: str,
    decode: Callable[[bytes], object],
    kind: type,
    what: str,
    serve: Callable[[Any, int, bytes], Awaitable[int]],
) -> int:
    """A rampwatch child process (the driver behind the UI, a driver worker): it dies with its parent, reads its
    start message (`kind`, decoded by `decode`) from stdin's first line, keeps the real stdout for its stream
    (anything printed goes to stderr), and runs `serve(start, out_fd, rest)` on the driver's own loop."""
    from rampwatch.drivers.run import event_loop, lifetime
    from rampwatch.drivers.run.exitcodes import EXIT_CRASHED, crash_summary

    lifetime.die_with_parent()  # SIGTERM when its parent dies, however it died
    first, rest = first_line(0)
    try:
        start = decode(first)
    except Exception as e:  # noqa: BLE001
        print(f"rampwatch {name}: bad start message: {crash_summary(e)}", file=sys.stderr)
        return 2
    if not isinstance(start, kind):
        print(f"rampwatch {name}: the first message must be {what}", file=sys.stderr)
        return 2
    out_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        return event_loop.run(serve(start, out_fd, rest))  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - its parent turns this exit code into "crashed"
        print(f"rampwatch {name} crashed: {crash_summary(e)}", file=sys.stderr)
        return EXIT_CRASHED
