"""TLS over the kernel-stamped socket (drivers/net/tls_records.py): a handshake that fails is a connection that
failed, as over asyncio's transport; a stream cut inside a record, or a record that does not decrypt, drops the
response. Streams over it are tests/test_chat.py's (its TLS kind) and the stamps of
reads handled late tests/test_client_lag.py's."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

import pytest

from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.net.stamped_socket import SO_TIMESTAMPNS, StampedSocket
from rampwatch.drivers.net.tls import is_untrusted
from rampwatch.drivers.net.wire import Connection, ConnectionDropped, ConnectionFailed

pytestmark = pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="no SO_TIMESTAMPNS here: TLS goes through asyncio")


async def test_an_untrusted_certificate_or_a_server_without_tls_fails_to_connect(self_signed):
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def plain(reader, writer):  # answers a ClientHello as an HTTP server would, then closes
        await reader.read(1024)
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def hello(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    tls_server = await asyncio.start_server(hello, "127.0.0.1", 0, ssl=server_tls)
    plain_server = await asyncio.start_server(plain, "127.0.0.1", 0)
    tls_port, plain_port = (s.sockets[0].getsockname()[1] for s in (tls_server, plain_server))
    async with tls_server, plain_server:
        default = Connection(f"https://127.0.0.1:{tls_port}", RunClock(), tls=ssl.create_default_context())
        with pytest.raises(ConnectionFailed) as untrusted:
            await default.get("/", {}, timeout=10)
        assert is_untrusted(untrusted.value)

        not_tls = Connection(f"https://127.0.0.1:{plain_port}", RunClock(), tls=ssl.create_default_context(cafile=cert))
        with pytest.raises(ConnectionFailed) as refused:
            await not_tls.get("/", {}, timeout=10)
        assert not is_untrusted(refused.value)

        trusted = Connection(f"https://127.0.0.1:{tls_port}", RunClock(), tls=ssl.create_default_context(cafile=cert))
        assert await trusted.get("/", {}, timeout=10) == (200, b"ok")
        assert isinstance(trusted._proto, StampedSocket) and trusted._proto.tls is not None  # kernel-stamped
        trusted.close()


class _RecordServer:
    """A TLS server on a thread that writes its records by hand (ssl.MemoryBIO): one connection, whose handshake
    it completes, whose request it reads, and to which it sends `answer(records)`'s bytes raw, then closes
    without close_notify. `records(data)` encrypts `data` as one TLS record (or a few, over 16 KB)."""

    def __init__(self, cert: str, key: str, answer):
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, args=(answer,), daemon=True)
        self.thread.start()

    def _serve(self, answer) -> None:
        conn, _ = self.listener.accept()
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.ctx.wrap_bio(incoming, outgoing, server_side=True)
        with conn:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    conn.sendall(outgoing.read())
                    incoming.write(conn.recv(65536))
            conn.sendall(outgoing.read())
            request = b""
            while b"\r\n\r\n" not in request:
                try:
                    request += tls.read(65536)
                except ssl.SSLWantReadError:
                    incoming.write(conn.recv(65536))

            def records(data: bytes) -> bytes:
                tls.write(data)
                return outgoing.read()

            conn.sendall(answer(records))

    def close(self) -> None:
        self.thread.join(5)
        self.listener.close()


async def _body_until_it_ends(url: str, cert: str) -> tuple[bytes, BaseException | None]:
    """A GET's body as it arrived, and how the response ended (None: complete)."""
    got: list[bytes] = []
    conn = Connection(url, RunClock(), tls=ssl.create_default_context(cafile=cert))
    try:
        await conn.post("/", b"", {}, lambda status, data, t: got.append(data), timeout=10)
        return b"".join(got), None
    except ConnectionDropped as e:
        return b"".join(got), e
    finally:
        conn.close()


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n"  # the body ends with the connection
CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def test_a_stream_cut_inside_a_record_is_dropped_and_a_whole_one_complete(self_signed):
    """Without close_notify, as servers often end: a body delimited by the close is complete, as over asyncio's
    transport; a chunked stream cut inside a record is dropped, with what the records before it carried."""
    whole = _RecordServer(*self_signed, lambda records: records(HEAD) + records(b"hello ") + records(b"world"))
    cut = _RecordServer(
        *self_signed, lambda records: records(CHUNKED) + records(b"6\r\nhello \r\n") + records(b"5\r\nworld\r\n")[:-7]
    )
    try:
        assert await _body_until_it_ends(whole.url, self_signed[0]) == (b"hello world", None)
        body, ended = await _body_until_it_ends(cut.url, self_signed[0])
        assert body == b"hello " and isinstance(ended, ConnectionDropped)
    finally:
        whole.close()
        cut.close()


async def test_a_record_that_does_not_decrypt_drops_the_response(self_signed):
    """A record that does not decrypt (its last byte flipped, as a corrupted or forged record reads) ends the
    connection at once: the response is dropped, never complete, and nothing after it is read."""

    def corrupted(records) -> bytes:
        bad = bytearray(records(b"world"))
        bad[-1] ^= 0xFF
        return records(HEAD) + records(b"hello ") + bytes(bad) + records(b"never read")

    server = _RecordServer(*self_signed, corrupted)
    try:
        body, ended = await _body_until_it_ends(server.url, self_signed[0])
        assert b"hello ".startswith(body) and isinstance(ended, ConnectionDropped)
    finally:
        server.close()
