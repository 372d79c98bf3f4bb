"""Test helpers: an ASGI app, or a whole simulated engine, on a loopback port in a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rampwatch.drivers.sim.app import SimServer
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.hosting import uvicorn_server
from rampwatch.drivers.sim.profiles import SimProfile
from rampwatch.drivers.sim.sockets import loopback_socket


class ThreadedServer:
    """An ASGI app on a loopback port, in a thread of its own (tests)."""

    def __init__(self, app: Any, port: int = 0, tls: tuple[str, str] | None = None):
        self.sock = loopback_socket(port=port)
        self.port = self.sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.server = uvicorn_server(app, tls)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class ThreadedSim(ThreadedServer):
    """A simulated server on a loopback port, in a thread of its own (tests)."""

    def __init__(
        self,
        profile: SimProfile,
        faults: SimFaults | None = None,
        port: int = 0,
        api_key: str | None = None,
        tls: tuple[str, str] | None = None,
        **server: Any,
    ):
        """`server`: SimServer's options (gpus, node, flavor, cache_report)."""
        self.sim = SimServer(profile, faults=faults, api_key=api_key, **server)
        super().__init__(self.sim.app, port, tls)

    def __enter__(self) -> ThreadedSim:
        super().__enter__()
        return self


class TextServer:
    """Plain-text pages (a /metrics or a dcgm-exporter) on a loopback port, recording (path, Authorization) of
    every request: for tests of what rampwatch sends to the hosts it scrapes."""

    def __init__(self, body_for: Callable[[str], str]):
        self.requests: list[tuple[str, str | None]] = []
        seen, body = self.requests, body_for

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                seen.append((self.path, self.headers.get("Authorization")))
                data = body(self.path).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def auth_on(self, path: str) -> set[str | None]:
        return {auth for p, auth in self.requests if p == path}

    def __enter__(self) -> TextServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()


class CaptureRelay:
    """A loopback TCP relay in front of a server that keeps every byte clients send through it, per connection:
    for tests of what reaches a real server (headers, request bodies) without asking the server to log it."""

    def __init__(self, target_url: str, connect_delay_s: float = 0.0):
        """`connect_delay_s`: each connection waits this long before it reaches the server (a slow link)."""
        self.target, self.connect_delay_s = urlsplit(target_url), connect_delay_s
        self.sent: list[bytearray] = []  # what each connection's client sent, in order
        self._lock = threading.Lock()
        self.listener = loopback_socket()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def requests_to(self, path: str) -> list[bytes]:
        """Each request (head and body, framed by its Content-Length) whose request line names `path`."""
        with self._lock:
            streams = [bytes(b) for b in self.sent]
        out = []
        for data in streams:
            while (end := data.find(b"\r\n\r\n")) >= 0:
                head = data[:end]
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                size = end + 4 + (int(length.group(1)) if length else 0)
                if head.split(b" ", 2)[1] == path.encode():
                    out.append(data[:size])
                data = data[size:]
        return out

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        time.sleep(self.connect_delay_s)
        try:
            upstream = socket.create_connection((self.target.hostname, self.target.port))
        except OSError:  # the server is gone (the test is ending): the client sees its connection close
            client.close()
            return
        kept = bytearray()
        with self._lock:
            self.sent.append(kept)
        threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True).start()
        self._pipe(client, upstream, kept)

    def _pipe(self, src: socket.socket, dst: socket.socket, kept: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if kept is not None:
                    with self._lock:
                        kept += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> CaptureRelay:
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()
