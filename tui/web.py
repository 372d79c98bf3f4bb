"""`--web [HOST:]PORT`: the same Textual app in a browser, with textual-serve.

textual-serve starts one app process per page. For a replay that process
plays the recording; for a live run (run, demo, watch) it follows the run's
recording as it grows (`rampwatch replay --follow`), so any number of pages
show the one run, and a page's process knows nothing but the recording's
path: no API key, no server credentials. The web server runs in a child
process of its own (`python -m rampwatch.tui.web`), loopback unless a host is
given, with the API key variables removed from its environment.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

SECRET_VARIABLES = ("OPENAI_API_KEY",)  # never in the page processes' environment


def page_command(recording: Path, follow: bool, speed: float = 1.0) -> str:
    """The shell command textual-serve runs for each page."""
    argv = [sys.executable, "-m", "rampwatch.tui.cli", "replay", str(recording.resolve())]
    argv += ["--follow"] if follow else ["--speed", f"{speed:g}"]
    return shlex.join(argv)


class WebServer:
    """textual-serve in a child process, serving `command` at http://HOST:PORT."""

    def __init__(self, command: str, host: str, port: int, title: str, secret: str | None = None):
        """`secret`: the run's API key; no variable holding it reaches the page processes."""
        self.url = f"http://{host}:{port}"
        env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES and (secret is None or v != secret)}
        self.proc = subprocess.Popen([sys.executable, "-m", "rampwatch.tui.web", "--host", host, "--port", str(port),
                                      "--title", title, "--command", command],
                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_ready(self, timeout: float = 20.0) -> str | None:
        """None once the page answers; else why it does not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read() if self.proc.stderr else b"").decode(errors="replace").strip()
                return err.splitlines()[-1] if err else f"the web server exited with code {self.proc.returncode}"
            try:
                if httpx.get(self.url, timeout=1.0).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        return "the web server did not answer in time"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rampwatch.tui.web", description="serve rampwatch's UI with textual-serve")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--title", default="rampwatch")
    p.add_argument("--command", required=True, help="the shell command that runs the app for one page")
    args = p.parse_args(argv)
    from textual_serve.server import Server

    Server(args.command, host=args.host, port=args.port, title=args.title).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
