#!/usr/bin/env python3
"""What the UI writes to the terminal: prints bytes/s, asserts nothing.

A GPU node is watched over SSH, often through a jump host; every byte the UI
writes crosses that link. This runs rampwatch in a real terminal (tmux at a
given size), counts what it writes with `tmux pipe-pane`, and prints the rate
averaged over the window, for:

  demo     `rampwatch demo --no-record` (two sessions, glm-like, the live ramp)
  many     `rampwatch demo --no-record --sessions 64 --scale-to 32k` (glm-like: streams for minutes)

at 80x24, 120x40 and 200x60. Bar (issue 23): the two-session demo at 120x40
writes at most 10 KB/s averaged over 60 s.

usage: python tests/bench_terminal.py [--seconds 60] [--sizes 80x24,120x40,200x60] [--cases demo,many]
                                      [--refresh S]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAMPWATCH = str(Path(sys.executable).parent / "rampwatch")
CASES = {
    "demo": ["demo", "--no-record"],
    "many": ["demo", "--no-record", "--sessions", "64", "--scale-to", "32k"],
}
SETTLE_S = 3.0  # the app's start (imports, first full paint) is not what a long watch costs


def measure(case: list[str], width: int, height: int, seconds: float, extra: list[str]) -> tuple[float, float]:
    """(bytes/s after the first SETTLE_S, bytes of the first paint) for one command in one terminal size."""
    session = f"rw-bench-{os.getpid()}-{width}x{height}"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "pane.bytes"
        command = shlex.join([RAMPWATCH, *case, *extra])
        env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor"}
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), f"{command}; sleep 3600"],
            check=True,
            env=env,
        )
        try:
            subprocess.run(
                ["tmux", "pipe-pane", "-t", session, "-o", f"cat >> {shlex.quote(str(log))}"], check=True, timeout=10
            )
            time.sleep(SETTLE_S)
            first = log.stat().st_size if log.exists() else 0
            time.sleep(seconds)
            total = log.stat().st_size if log.exists() else 0
        finally:
            subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=False, timeout=10)
            time.sleep(1.0)
            subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True, timeout=10)
    return (total - first) / seconds, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measured window per case and size (default 60)")
    ap.add_argument("--sizes", default="80x24,120x40,200x60", help="terminal sizes, WxH,...")
    ap.add_argument("--cases", default="demo,many", help=f"which of {','.join(CASES)}")
    ap.add_argument("--refresh", type=float, default=None, help="pass --refresh S to rampwatch")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("bench_terminal: tmux is not installed (apt-get install tmux)", file=sys.stderr)
        return 2
    extra = ["--refresh", str(args.refresh)] if args.refresh is not None else []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# rampwatch terminal output, commit {commit}, {time.strftime('%Y-%m-%d')}, {args.seconds:g} s a case")
    print(f"{'case':<6} {'size':>7} {'KB/s':>7} {'first paint KB':>15}")
    for name in args.cases.split(","):
        for size in args.sizes.split(","):
            w, h = (int(x) for x in size.split("x"))
            rate, first = measure(CASES[name], w, h, args.seconds, extra)
            print(f"{name:<6} {size:>7} {rate / 1000:>7.1f} {first / 1000:>15.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
