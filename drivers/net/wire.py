"""A minimal HTTP/1.1 client for what shares the loop that stamps the streams: a streaming POST, and a GET.

httpx costs ~40 µs of CPU per network read (coroutine layers per read);
here each read lands in the connection's own buffer, is stamped first, and
flows straight into the SSE parser (http_response.py), for a few µs. Plain HTTP
is read from its socket with the kernel's receive time of each read
(stamped_socket.py), so a read the loop comes to late keeps when its bytes
arrived; so is TLS, decrypted as it is read (tls_records.py). On a clock not
the run's, or without SO_TIMESTAMPNS, a connection goes through asyncio's transport (a BufferedProtocol:
the stock Protocol path allocates a fresh 256 KiB bytes object per read), and on
the driver's own loop is stamped when the loop woke for the read
(drivers/run/event_loop.py), so a read handled after 63 others in the same pass
is not stamped late by their work. One keep-alive connection per session, which also
carries the session's /tokenize counts between its turns
(tokenizer.over_connection); each engine's /metrics scraper keeps one too
(telemetry/metrics.py). Everything else (probes, calibration, Prometheus,
GPU exporters) stays on httpx.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.net.http_response import (
    READ_BUFFER,
    ConnectionDropped,
    ConnectionFailed,
    ResponseParser,
    ResponseReader,
    write_slices,
)
from rampwatch.drivers.net.stamped_socket import SO_TIMESTAMPNS, StampedSocket
from rampwatch.drivers.net.tls import tls_context

SSE_OR_JSON = "text/event-stream, application/json"  # what a POST accepts: a stream, or an error's JSON
T = TypeVar("T")


def url_credentials(url: str) -> dict[str, str]:
    """The Authorization header that user:password@ in `url` stands for (Basic), or none."""
    u = urlsplit(url)
    if u.username is None:
        return {}
    pair = f"{unquote(u.username)}:{unquote(u.password or '')}".encode()
    return {"Authorization": "Basic " + base64.b64encode(pair).decode()}


async def within(aw: Awaitable[T], timeout: float | None) -> T:
    """`aw` awaited, failing with asyncio.TimeoutError after `timeout` s (None: no limit). Unlike
    asyncio.wait_for before Python 3.12, it never swallows a cancellation that comes as `aw` finishes: a stop
    arriving in the pass that completed a scrape or a turn would be lost, and the task would run on."""
    if timeout is None:
        return await aw
    inner = asyncio.ensure_future(aw)
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = inner.cancel()

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return await inner
    except asyncio.CancelledError:
        task = asyncio.current_task()
        stopped = task is not None and task.cancelling() > 0
        if expired and not stopped:
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()


def piled_up() -> bool | None:
    """A read just handled carried several tokens under one stamp (the kernel's, of its last bytes): the earlier
    ones came before it, by as long as the loop took to come to them. None: no more than 5 ms (or off the driver's
    own loop, which does not time its passes); else whether the driver's own work held them
    (event_loop.PassSelector.piled_up)."""
    try:
        passes = getattr(asyncio.get_running_loop(), "passes", None)
    except RuntimeError:  # parsed off any loop (a recorded stream read back)
        return None
    return passes.piled_up() if passes is not None else None


def read_stamp(clock: Callable[[], float]) -> Callable[[], float]:
    """What this loop's reads are stamped with: when the loop woke for them, on `clock`, where the loop says
    (the driver's own loop: `passes.read_time()`, on time.perf_counter, which the run's clock counts from);
    else `clock` read as the read is handled."""
    passes = getattr(asyncio.get_running_loop(), "passes", None)
    if passes is None or not isinstance(clock, RunClock):
        return clock
    read_time, origin = passes.read_time, clock.origin
    return lambda: read_time() - origin


class _Protocol(ResponseReader, asyncio.BufferedProtocol):
    """A connection over asyncio's transport (a clock not the run's, or a system without SO_TIMESTAMPNS): each
    read stamped when the loop woke for it."""

    def __init__(self, stamp: Callable[[], float]):
        self.stamp = stamp
        self._read_into = memoryview(bytearray(READ_BUFFER))
        self.transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def send(self, parts: Sequence[bytes]) -> None:
        """Write `parts` in order, a slice at a time as the socket takes them (small parts
        gathered into one write, large ones sliced without a copy); stops early if the
        connection goes (the response then says why)."""
        assert self.transport is not None
        for piece in write_slices(parts):
            if not await self._write(piece):
                return

    async def _write(self, data: bytes | bytearray | memoryview) -> bool:
        """One write once the transport has room; False when the connection is gone."""
        if not self._writable.is_set():
            await self._writable.wait()
        if self.closed:
            return False
        assert self.transport is not None
        self.transport.write(data)
        return True

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_into

    def buffer_updated(self, nbytes: int) -> None:
        t = self.stamp()  # stamped before anything else looks at the bytes
        self.take(bytes(self._read_into[:nbytes]), t)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()  # a send waiting for room stops
        self.ended(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Connection:
    """One keep-alive HTTP/1.1 connection to `base_url`, reopened when needed."""

    def __init__(
        self,
        base_url: str,
        clock: Callable[[], float],
        connect_timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
    ):
        u = urlsplit(base_url)
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        name = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal keeps its brackets (RFC 9110 §7.2)
        self.host_header = name if u.port is None else f"{name}:{self.port}"
        self.clock, self.connect_timeout = clock, connect_timeout
        self.tls = tls
        self._proto: _Protocol | StampedSocket | None = None

    async def _connect(self) -> _Protocol | StampedSocket:
        """A fresh connection: on the run's clock it reads the kernel's receive times, over plain HTTP or TLS
        (stamped_socket.py); on another clock (or without SO_TIMESTAMPNS) it goes through asyncio's transport,
        stamped when the loop woke."""
        loop = asyncio.get_running_loop()
        ctx = (self.tls or tls_context()) if self.https else None
        wake_stamp = read_stamp(self.clock)
        try:
            if isinstance(self.clock, RunClock) and SO_TIMESTAMPNS is not None:
                opened = StampedSocket.open(self.host, self.port, self.clock, wake_stamp, ctx)
                return await within(opened, self.connect_timeout)
            _, proto = await within(
                loop.create_connection(lambda: _Protocol(wake_stamp), self.host, self.port, ssl=ctx),
                self.connect_timeout,
            )
        except (TimeoutError, OSError) as e:
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port}: {e.__class__.__name__}") from None
        return proto

    async def post(
        self,
        path: str,
        body: bytes | Sequence[bytes],
        headers: dict[str, str],
        on_body: Callable[[int, bytes, float], None],
        timeout: float | None = None,
    ) -> ResponseParser:
        """Send a POST and feed the response body to `on_body` as it arrives.
        Returns the parser (status, headers) once the response is complete.
        `body` may come in parts (a history's messages), sent without joining them."""
        parts = [body] if isinstance(body, bytes) else list(body)
        return await self._request("POST", path, parts, headers, on_body, timeout, SSE_OR_JSON)

    async def get(self, path: str, headers: dict[str, str], timeout: float | None = None) -> tuple[int, bytes]:
        """A GET (a /metrics scrape): its status and whole body. The scrape shares the loop that stamps the
        streams, and httpx spends ~2.5 ms of CPU on a 22 KB one here, this ~0.1 ms."""
        body: list[bytes] = []
        parser = await self._request("GET", path, [], headers, lambda _s, data, _t: body.append(data), timeout)
        return parser.status or 0, b"".join(body)

    async def _request(
        self,
        method: str,
        path: str,
        parts: list[bytes],
        headers: dict[str, str],
        on_body: Callable[[int, bytes, float], None],
        timeout: float | None,
        accept: str = "*/*",
    ) -> ResponseParser:
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host_header}"]
        if parts:
            head.append(f"Content-Length: {sum(map(len, parts))}")
        head += [f"Accept: {accept}", "User-Agent: rampwatch"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        request_head = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        reused = self._proto is not None and not self._proto.closed
        if not reused:
            self._proto = await self._connect()
        proto = self._proto
        assert proto is not None
        received = False

        def body_seen(status: int, data: bytes, t: float) -> None:
            nonlocal received
            received = True
            on_body(status, data, t)

        parser = ResponseParser(body_seen)
        proto.parser = parser
        loop = asyncio.get_running_loop()
        proto.finished = loop.create_future()
        sender = loop.create_task(proto.send([request_head, *parts]))
        try:
            await within(proto.finished, timeout)
        except ConnectionDropped:
            sender.cancel()
            self._proto = None
            if reused and parser.status is None and not received:
                # The server had closed the idle keep-alive connection: once more on a fresh one.
                return await self._request(method, path, parts, headers, on_body, timeout, accept)
            raise
        except BaseException:
            sender.cancel()
            self.close()  # cancelled or timed out mid-response: this connection is spent
            raise
        if not sender.done():  # answered before the whole body went out: the rest must not start the next request
            sender.cancel()
            self.close()
        elif not parser.keep_alive:
            self.close()
        return parser

    def close(self) -> None:
        if self._proto is not None:
            self._proto.close()
        self._proto = None
