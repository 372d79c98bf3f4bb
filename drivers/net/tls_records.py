"""TLS over a socket rampwatch reads itself (stamped_socket.py): its records go through OpenSSL in memory
(ssl.MemoryBIO, as asyncio's own TLS transport does), so a read over TLS keeps the kernel's receive time of its
bytes, as over plain HTTP, where asyncio's transport could only stamp it when the loop woke."""

from __future__ import annotations

import asyncio
import socket
import ssl

from rampwatch.drivers.net.http_response import READ_BUFFER


class TlsRecords:
    """One client connection's TLS: the handshake over its socket, then each read's bytes decrypted as they
    come and each write encrypted, in order."""

    def __init__(self, ctx: ssl.SSLContext, host: str):
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_hostname=host)
        self.peer_closed = False  # the server ended TLS (close_notify): nothing more will come
        self.error: ssl.SSLError | None = None  # what a read's bytes held that was not TLS: the connection is spent

    async def handshake(self, sock: socket.socket) -> None:
        """The handshake over `sock` (connected, non-blocking); ssl.SSLError (an untrusted certificate, a server
        that does not speak TLS) or ConnectionError if it fails."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            if out := self._out.read():
                await loop.sock_sendall(sock, out)
            data = await loop.sock_recv(sock, READ_BUFFER)
            if not data:
                raise ConnectionResetError("the server closed the connection during the TLS handshake")
            self._in.write(data)
        if out := self._out.read():  # the client's Finished
            await loop.sock_sendall(sock, out)

    def decrypt(self, data: bytes | memoryview) -> bytes:
        """What `data`, with the bytes read before it, completes of the server's records (b"" while a record is
        still partial). After close_notify, `peer_closed`; after bytes that are not TLS (a fatal alert, a broken
        record), `error`, with what OpenSSL gave before it."""
        self._in.write(data)
        pieces = []
        while True:
            try:
                piece = self._tls.read(READ_BUFFER)  # a record's worth at most
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                piece = b""
            except ssl.SSLError as e:
                self.error = e
                break
            if not piece:
                self.peer_closed = True
                break
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def encrypt(self, data: bytes | bytearray | memoryview) -> bytes:
        """The records that carry `data`, after anything TLS still had to send (the answer to a key update
        read since)."""
        view = memoryview(data)
        while view:
            view = view[self._tls.write(view) :]
        return self._out.read()
