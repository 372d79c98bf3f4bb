"""Listening sockets for the simulated engine, bound before it starts (by the
parent, for a child that inherits them), so a port is never raced for."""

from __future__ import annotations

import socket


def loopback_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on `host`:`port` (0: a free port), inheritable by a child process."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.set_inheritable(True)
    return sock
