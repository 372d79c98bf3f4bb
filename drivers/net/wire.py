"""A minimal HTTP/1.1 client for what shares the loop that stamps the streams: a streaming POST, and a GET.

httpx costs ~40 µs of CPU per network read (coroutine layers per read);
here each read lands in the connection's own buffer (a BufferedProtocol: the
stock Protocol path allocates a fresh 256 KiB bytes object per read, about a
quarter of the read's CPU), is stamped first, and flows straight into the SSE
parser, for a few µs. On the driver's own loop the stamp is when the loop woke
for the read (drivers/run/event_loop.py), so a read handled after 63 others in
the same pass is not stamped late by their work. One keep-alive connection per session, which also
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
from rampwatch.drivers.net.pass_share import take_turn
from rampwatch.drivers.net.tls import tls_context


class ConnectionFailed(Exception):
    """Could not open a connection: the server is not there."""


class ConnectionDropped(Exception):
    """The connection closed before the response was complete."""


class ResponseParser:
    """Incremental HTTP/1.x response parser: status and headers (interim 1xx
    responses skipped), then the body, framed by chunked encoding, by
    Content-Length, or by the connection closing (RFC 9112 §6.3), handed to
    `on_body(status, bytes, t)`."""

    def __init__(self, on_body: Callable[[int, bytes, float], None]):
        self.on_body = on_body
        self.status: int | None = None
        self.version = "HTTP/1.1"
        self.headers: dict[str, str] = {}
        self.done = False
        self.until_close = False  # neither chunked nor Content-Length: the body ends when the connection does
        self._buf = b""
        self._chunked = False
        self._remaining: int | None = None  # Content-Length left, or the current chunk's
        self._in_head = True
        self._state = "size"  # chunked decoding: size | data | crlf | trailer

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.until_close or connection == "close":
            return False
        return self.version != "HTTP/1.0" or connection == "keep-alive"  # HTTP/1.0 closes unless told otherwise

    def connection_closed(self) -> bool:
        """The connection ended: True when that completes the response (a close-delimited body)."""
        if self.until_close and not self._in_head:
            self.done = True
        return self.done

    def feed(self, data: bytes, t: float) -> None:
        while self._in_head:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._buf[:end].decode("latin-1"), self._buf[end + 4 :]
            self._buf = b""
            lines = head.split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2:
                raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
            self.version, self.status = parts[0], int(parts[1])
            if 100 <= self.status < 200 and self.status != 101:
                continue  # an interim response (100 Continue, 103 Early Hints): the real one follows
            for line in lines[1:]:
                k, _, v = line.partition(":")
                self.headers[k.strip().lower()] = v.strip()
            self._in_head = False
            self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
            if not self._chunked:
                length = self.headers.get("content-length")
                self._remaining = int(length) if length is not None else None
                if self._remaining == 0 or self.status in (204, 304):
                    self.done = True
                    return
                self.until_close = self._remaining is None
            if not data:
                return
        if self._chunked:
            self._feed_chunked(data, t)
        else:
            if self._remaining is not None:
                data = data[: self._remaining]
                self._remaining -= len(data)
                if self._remaining <= 0:
                    self.done = True
            if data:
                self.on_body(self.status or 0, data, t)

    def _feed_chunked(self, data: bytes, t: float) -> None:
        buf = self._buf + data if self._buf else data
        self._buf = b""
        out = []
        pos, n = 0, len(buf)
        while pos < n and not self.done:
            state = self._state
            if state == "data":
                take = min(self._remaining or 0, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._remaining = (self._remaining or 0) - take
                if self._remaining == 0:
                    self._state = "crlf"
            elif state == "crlf":
                if n - pos < 2:
                    break
                pos += 2
                self._state = "size"
            else:  # "size" line, or a trailer line after the last chunk
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                line, pos = buf[pos:eol], eol + 2
                if state == "trailer":
                    self.done = not line
                    continue
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    self._state = "trailer"
                else:
                    self._remaining, self._state = size, "data"
        if pos < n and not self.done:
            self._buf = buf[pos:]
        if out:
            self.on_body(self.status or 0, b"".join(out) if len(out) > 1 else out[0], t)


# A request body goes out in slices of this size, each when the transport has room: what it buffers
# stays near this, not a copy of the rest of a 4 MB prompt per session.
WRITE_SLICE = 256 * 1024
SSE_OR_JSON = "text/event-stream, application/json"  # what a POST accepts: a stream, or an error's JSON
T = TypeVar("T")
READ_BUFFER = 64 * 1024  # each connection's reads land here; a stream's chunk is a few hundred bytes


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


def read_stamp(clock: Callable[[], float]) -> Callable[[], float]:
    """What this loop's reads are stamped with: when the loop woke for them, on `clock`, where the loop says
    (the driver's own loop: `passes.read_time()`, on time.perf_counter, which the run's clock counts from);
    else `clock` read as the read is handled."""
    passes = getattr(asyncio.get_running_loop(), "passes", None)
    if passes is None or not isinstance(clock, RunClock):
        return clock
    read_time, origin = passes.read_time, clock.origin
    return lambda: read_time() - origin


class _Protocol(asyncio.BufferedProtocol):
    def __init__(self, stamp: Callable[[], float]):
        self.stamp = stamp
        self._read_into = memoryview(bytearray(READ_BUFFER))
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.finished: asyncio.Future[None] | None = None
        self.closed = False
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
        small = bytearray()
        for part in parts:
            if len(part) < WRITE_SLICE:
                small += part
                if len(small) < WRITE_SLICE:
                    continue
                part, small = bytes(small), bytearray()
            elif small:
                if not await self._write(small):
                    return
                small = bytearray()
            view = memoryview(part)
            for start in range(0, len(view), WRITE_SLICE):
                if not await self._write(view[start : start + WRITE_SLICE]):
                    return
        if small:
            await self._write(small)

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
        p, fut = self.parser, self.finished
        if p is None or fut is None or fut.done():
            return
        try:
            p.feed(bytes(self._read_into[:nbytes]), t)
        except Exception as e:  # noqa: BLE001 - a parse error fails this request only
            fut.set_exception(e)
            return
        if p.done:
            fut.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()  # a send waiting for room stops
        fut = self.finished
        if fut is None or fut.done():
            return
        if self.parser is not None and exc is None and self.parser.connection_closed():
            fut.set_result(None)  # a body delimited by the close is complete
        else:
            fut.set_exception(ConnectionDropped("connection closed mid-response"))


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
        self._proto: _Protocol | None = None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        ctx = (self.tls or tls_context()) if self.https else None
        await take_turn()  # 256 sessions connecting at once: their connects (and what each costs) take turns
        try:
            _, proto = await within(
                loop.create_connection(lambda: _Protocol(read_stamp(self.clock)), self.host, self.port, ssl=ctx),
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
        assert proto is not None and proto.transport is not None
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
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._proto = None
