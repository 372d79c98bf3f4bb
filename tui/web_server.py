"""`--web [HOST:]PORT`: the same Textual app in a browser, with textual-serve.

textual-serve starts one app process per page. For a replay that process
plays the recording; for a live run (run, demo, watch) it follows the run's
recording as it grows (`rampwatch replay --follow`), so any number of pages
show the one run, and a page's process knows nothing but the recording's
path: no API key, no server credentials. The web server runs in a child
process of its own (`python -m rampwatch.tui.web_server`), loopback unless a
host is given, with the API key variables removed from its environment.

Neither outlives its parent: the web server dies with the rampwatch process
that started it, and each page's process (`python -m rampwatch.tui.cli.page`)
with the web server (see drivers/run/lifetime.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rampwatch.drivers.run import lifetime

SECRET_VARIABLES = ("OPENAI_API_KEY",)  # never in the page processes' environment


def page_command(recording: Path, follow: bool, speed: float = 1.0, refresh_s: float | None = None) -> str:
    """The shell command textual-serve runs for each page. `exec`: the page's
    process is the web server's child, not a shell's, so it dies with the server."""
    argv = [sys.executable, "-m", "rampwatch.tui.cli.page", "replay", str(recording.resolve())]
    argv += ["--follow"] if follow else ["--speed", f"{speed:g}"]
    argv += ["--refresh", f"{refresh_s:g}"] if refresh_s is not None else []
    return "exec " + shlex.join(argv)


class WebServer:
    """textual-serve in a child process, serving `command` at http://HOST:PORT."""

    def __init__(self, command: str, host: str, port: int, title: str, secrets: tuple[str | None, ...] = ()):
        """`secrets`: the run's API key and metrics token; no variable holding one reaches the page processes."""
        self.url = f"http://{host}:{port}"
        hidden = {s for s in secrets if s}
        env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES and v not in hidden}
        # Its log goes to a file, never a pipe nobody reads while it serves (a full pipe would block it).
        self._log = tempfile.TemporaryFile()
        self.proc = lifetime.adopt(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rampwatch.tui.web_server",
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--title",
                    title,
                    "--command",
                    command,
                ],
                env=lifetime.child_env(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                start_new_session=True,
            )
        )  # a process group of its own, with its pages: close() ends them together

    def wait_ready(self, timeout: float = 20.0) -> str | None:
        """None once the page answers; else why it does not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                err = self._log.read().decode(errors="replace").strip()
                return err.splitlines()[-1] if err else f"the web server exited with code {self.proc.returncode}"
            try:
                if httpx.get(self.url, timeout=1.0).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        return "the web server did not answer in time"

    def wait(self) -> int:
        """Wait until the web server exits. SIGTERM or SIGHUP, now or while the
        run's event loop held them, raise lifetime.Stopped: Ctrl-C alone stops a
        run and leaves its pages up."""
        lifetime.stop_on_signals()
        return self.proc.wait()

    def close(self) -> None:
        """End the web server and every page's process."""
        lifetime.end(self.proc)


def serve(argv: list[str]) -> int:
    """The web server: textual-serve, until SIGTERM, or its parent dies."""
    p = argparse.ArgumentParser(
        prog="python -m rampwatch.tui.web_server", description="serve rampwatch's UI with textual-serve"
    )
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--title", default="rampwatch")
    p.add_argument("--command", required=True, help="the shell command that runs the app for one page")
    args = p.parse_args(argv)
    lifetime.die_with_parent()
    os.environ.update(lifetime.child_env({}))  # textual-serve gives each page a copy of this environment
    from textual_serve.server import Server

    class PromptServer(Server):
        def request_exit(self) -> None:
            """SIGTERM or SIGINT (textual-serve's handlers call this): leave now, see leave()."""
            leave(signal.SIGTERM)

    signal.signal(signal.SIGHUP, lambda sig, frame: leave(sig))
    PromptServer(args.command, host=args.host, port=args.port, title=args.title).serve()
    return 0


def leave(sig: int) -> None:
    """End every page's process and this one, at once. textual-serve's graceful
    exit would wait up to a minute for each browser to close its websocket (a
    laptop asleep never does). The pages share this process's group when it
    leads one (WebServer starts it so); they also die with it (die_with_parent)."""
    if os.getpgrp() == os.getpid():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(os.getpid(), signal.SIGTERM)
    os._exit(128 + sig)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
