"""An HTTP/1.x response as it arrives over one of rampwatch's own connections (wire.py): the parser, and what
every kind of connection does with the bytes it reads (ResponseReader): the kernel-stamped socket's
(stamped_socket.py) and the asyncio transport's (a clock not the run's, or no kernel time)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence

READ_BUFFER = 64 * 1024  # each connection's reads land here; a stream's chunk is a few hundred bytes
# A request body goes out in slices of this size, each when the socket has room: what the transport buffers
# stays near this, not a copy of the rest of a 4 MB prompt per session.
WRITE_SLICE = 256 * 1024


def write_slices(parts: Sequence[bytes]) -> Iterator[bytes | bytearray | memoryview]:
    """`parts` as the writes that send them in order: small ones gathered into one, large ones sliced without a
    copy."""
    small = bytearray()
    for part in parts:
        if len(part) < WRITE_SLICE:
            small += part
            if len(small) < WRITE_SLICE:
                continue
            part, small = bytes(small), bytearray()
        elif small:
            yield small
            small = bytearray()
        view = memoryview(part)
        for start in range(0, len(view), WRITE_SLICE):
            yield view[start : start + WRITE_SLICE]
    if small:
        yield small


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


class ResponseReader:
    """The response in flight on a connection: its parser and the future that completes with it. `take` feeds
    a read's bytes stamped `t`; `ended` says the connection closed (`exc`: why, None for a clean close)."""

    parser: ResponseParser | None = None
    finished: asyncio.Future[None] | None = None
    closed = False

    def take(self, data: bytes, t: float) -> None:
        p, fut = self.parser, self.finished
        if p is None or fut is None or fut.done():
            return
        try:
            p.feed(data, t)
        except Exception as e:  # noqa: BLE001 - a parse error fails this request only
            fut.set_exception(e)
            return
        if p.done:
            fut.set_result(None)

    def ended(self, exc: BaseException | None) -> None:
        self.closed = True
        fut = self.finished
        if fut is None or fut.done():
            return
        if self.parser is not None and exc is None and self.parser.connection_closed():
            fut.set_result(None)  # a body delimited by the close is complete
        else:
            fut.set_exception(ConnectionDropped("connection closed mid-response"))
