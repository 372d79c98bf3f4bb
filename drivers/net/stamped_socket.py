"""A connection whose reads carry the kernel's own receive time (SO_TIMESTAMPNS, on Linux), over plain HTTP or
TLS (decrypted as read: tls_records.py).

Over asyncio's transport a read can only be stamped when the loop woke for it (event_loop.py), so a pass that
held the loop (256 streams' reads, a turn's text, the collector) puts off the stamps of what arrived meanwhile,
and their turns are marked `client busy`. Here the kernel says when each read's last bytes reached this
machine's socket, and the stamp is that, however late the loop came to read them: such reads need no mark
(a late wake marks only the reads stamped at it). The socket is read by a reader registered on the loop with
recvmsg_into (an asyncio transport's reads carry no ancillary data) and written with sock_sendall. Where the
kernel gives no time (not Linux, a sandbox that does not stamp), a read is stamped at the wake."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Sequence

from rampwatch.drivers.net.http_response import READ_BUFFER, ResponseReader, write_slices
from rampwatch.drivers.net.tls_records import TlsRecords

# SO_TIMESTAMPNS (its control message has the same number): 35 on Linux's common ABIs; Python names it from 3.12.
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
ANCILLARY = socket.CMSG_SPACE(16)  # one struct timespec
_TIMESPEC = struct.Struct("qq")


class StampedSocket(ResponseReader):
    """One connected TCP socket: `send` writes a request, and each read feeds the response in flight (the
    ResponseReader's), stamped on `clock` (the run's) with when the kernel received it; over `tls` once the
    handshake is done, each read's bytes decrypted as far as they complete the server's records."""

    def __init__(
        self,
        sock: socket.socket,
        clock: Callable[[], float],
        wake_stamp: Callable[[], float],
        tls: TlsRecords | None = None,
    ):
        self.sock, self.clock, self.wake_stamp, self.tls = sock, clock, wake_stamp, tls
        _ask_kernel_times(sock)
        self._into = bytearray(READ_BUFFER)
        self._view = memoryview(self._into)
        self._open = True
        # The last read's stamp, or when it emptied the socket if it did: the next read's bytes came after it.
        self._floor = -float("inf")
        self._loop = asyncio.get_running_loop()
        self._passes = getattr(self._loop, "passes", None)  # the driver loop's selector, told each kernel stamp
        self._loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        clock: Callable[[], float],
        wake_stamp: Callable[[], float],
        tls_context: ssl.SSLContext | None = None,
    ) -> StampedSocket:
        """Connected to the first of `host`'s addresses that answers, over TLS with `tls_context`; OSError if
        none does (ssl.SSLError: the handshake failed)."""
        loop = asyncio.get_running_loop()
        try:  # an address needs no resolver (a thread pool's round trip, after the request was stamped)
            infos = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST
            )
        except socket.gaierror:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        error: OSError = OSError(f"no address for {host}")
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's transports do
                await loop.sock_connect(sock, address)
            except OSError as e:
                sock.close()
                error = e
                continue
            except BaseException:
                sock.close()
                raise
            if tls_context is None:
                return cls(sock, clock, wake_stamp)
            try:
                _ask_kernel_times(sock)  # before the handshake: what comes with its last bytes is stamped too
                records = TlsRecords(tls_context, host)
                await records.handshake(sock)
            except BaseException:
                sock.close()
                raise
            return cls(sock, clock, wake_stamp, records)
        raise error

    def _readable(self) -> None:
        try:
            n, ancillary, _, _ = self.sock.recvmsg_into([self._into], ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        if not n:  # over TLS without close_notify too, as asyncio's transport: the response's framing decides
            self._lost(None)
            return
        t = self._stamp(ancillary, n)
        if self.tls is None:
            self.take(bytes(self._view[:n]), t)
        elif data := self.tls.decrypt(self._view[:n]):  # what the read completes of the server's records
            self.take(data, t)
        if self._passes is not None:
            self._passes.read_over()  # its kernel time is not a later read's
        if self.tls is not None and (self.tls.error is not None or self.tls.peer_closed):
            self._lost(self.tls.error)

    def _stamp(self, ancillary: list[tuple[int, int, bytes]], n: int) -> float:
        """When the kernel received this read's last bytes, on the run's clock: now less how long ago that was
        (the realtime clock's reading less the kernel's), and never before the last read's stamp or the last
        read that emptied the socket (its bytes came after both: stamps never go back, though the two clocks
        are read apart). Without a kernel time: when the loop woke for it. The driver loop is told both (whether
        a read that carried several tokens held them long, event_loop.PassSelector.piled_up)."""
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                sec, ns = _TIMESPEC.unpack_from(data)
                now = self.clock()
                floor = self._floor
                t = max(floor, now - max(0.0, time.time() - (sec + ns * 1e-9)))
                self._floor = now if n < len(self._into) else t
                if self._passes is not None:
                    to_perf = time.perf_counter() - now  # the run's clock to the loop's
                    self._passes.kernel_read(t + to_perf, floor + to_perf)
                return t
        return self.wake_stamp()

    async def send(self, parts: Sequence[bytes]) -> None:
        """Write `parts` in order, a slice at a time as the socket takes them; stops early if the connection goes
        (the response then says why)."""
        for piece in write_slices(parts):
            if self.closed:
                return
            if self.tls is not None:
                piece = self.tls.encrypt(piece)
            try:
                await self._loop.sock_sendall(self.sock, piece)
            except OSError as e:
                self._lost(e)
                return

    def _lost(self, exc: BaseException | None) -> None:
        self._shut()
        self.ended(exc)

    def close(self) -> None:
        """Close it; a response in flight ends as the close leaves it (complete only if the close delimits it)."""
        self._shut()
        self.ended(None)

    def _shut(self) -> None:
        if self._open:
            self._open = False
            fd = self.sock.fileno()
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)  # a send waiting for room: its fd may be reused once closed
            self.sock.close()


def _ask_kernel_times(sock: socket.socket) -> None:
    """Have the kernel stamp what `sock` receives; where it will not, each read is stamped at the wake
    (StampedSocket._stamp)."""
    if SO_TIMESTAMPNS is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass
