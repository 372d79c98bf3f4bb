"""--web for the commands: start the browser UI (tui/web_server.py) and say where it is, or why it cannot listen."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.telemetry.client_metrics import parse_listen

if TYPE_CHECKING:
    from rampwatch.tui.web_server import WebServer


def serve_web(listen: str, command: str, title: str, secrets: tuple[str | None, ...] = ()) -> WebServer:
    """Start the browser UI (BadInput when it cannot listen) and say where it is."""
    from rampwatch.tui.web_server import WebServer  # textual-serve, its web stack: only for --web

    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise BadInput(f"--web: {e}") from None
    server = WebServer(command, host, port, title, secrets=secrets)
    problem = server.wait_ready()
    if problem is not None:
        server.close()
        raise BadInput(f"--web {listen}: {problem}")
    print(
        f"rampwatch: the UI is at {server.url} (from a laptop: ssh -L {port}:127.0.0.1:{port} THIS-HOST, "
        f"then open http://127.0.0.1:{port})",
        file=sys.stderr,
        flush=True,
    )
    return server


def serve_until_interrupted(server: WebServer, why: str) -> None:
    print(f"rampwatch: {why}; still serving {server.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
