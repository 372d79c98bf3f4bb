"""TLS over the kernel-stamped socket (drivers/net/tls_records.py): a handshake that fails is a connection that
failed, as over asyncio's transport. Streams over it are tests/test_chat.py's (its TLS kind) and the stamps of
reads handled late tests/test_client_lag.py's."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.net.stamped_socket import SO_TIMESTAMPNS, StampedSocket
from rampwatch.drivers.net.tls import is_untrusted
from rampwatch.drivers.net.wire import Connection, ConnectionFailed

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
