"""Serving ASGI apps (simulated engines, the prefill/decode proxy) with uvicorn
on sockets bound beforehand."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import uvicorn

from rampwatch.drivers.sim.faults import SimulatedDrop


class _QuietDrops(logging.Filter):
    """The sim's deliberate drops (a fault knob) and requests cut at shutdown are not errors to log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, (SimulatedDrop, asyncio.CancelledError))


logging.getLogger("uvicorn.error").addFilter(_QuietDrops())


def uvicorn_server(app: Any, tls: tuple[str, str] | None = None) -> uvicorn.Server:
    """`tls`: (certificate, key) PEM files to serve https."""
    # Shutdown drops open streams after a second instead of waiting for them (like a crashed server).
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=3600,
        timeout_graceful_shutdown=1,
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    return uvicorn.Server(config)


async def serve_all(apps_: list[Any], sockets: list[socket.socket], tls: tuple[str, str] | None = None) -> None:
    """Every app on its socket in this event loop (https with `tls`), until one stops (Ctrl-C or SIGTERM stops
    all)."""
    servers = [uvicorn_server(app, tls) for app in apps_]
    tasks = [asyncio.create_task(s.serve(sockets=[sock])) for s, sock in zip(servers, sockets)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
