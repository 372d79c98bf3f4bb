#!/usr/bin/env python3
"""Does the driver stay out of its own measurements at 64 sessions? (issue 19)

Starts the simulated engine (`rampwatch sim`, its own process) at the pace
of a served model (the 'tiny' profile: about 30 tok/s a session at 64
sessions) and drives 64 sessions against it headless, as a user would
(`rampwatch run --headless`), then reads the recording's JSON report. Prints, and asserts nothing:
  - turns marked `client busy` (a first-token or token stamp taken while the
    driver's loop woke more than 5 ms late); the bar is none; and how many of
    them the driver's own work marked (the rest: the machine waking it late);
  - the run's worst loop lag, and its own work's (the CPU the driver spent in
    the pass that held its loop);
  - for scale, what the machine alone does to a loop that only sleeps, on the
    client's core for as long as the run took;
  - turns and output tokens, for scale.

On a machine with other work running the OS can hold the driver off a core
and mark turns that the driver itself did not delay: run it on a quiet machine.
By default the engine and the client each get a core of their own (`--pin`,
where there are two or more), as they would on a GPU node where the engine's
work is not the client's core; `--no-pin` lets the OS place them.

usage: python tests/bench_client_check.py [--sessions 64] [--schedule 2k,4k,8k] [--output-tokens 128] [--profile tiny]
                                          [--no-pin]
(--profile fast streams as fast as the engine process can: the driver is then CPU-bound by design.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import free_port, rampwatch_cmd  # noqa: E402


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the simulated engine exited {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit("the simulated engine did not come up")


def on_core(core: int | None):
    """A Popen preexec_fn that keeps the child (and what it starts) on one core; None: wherever the OS puts it."""
    if core is None:
        return None
    return lambda: os.sched_setaffinity(0, {core})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--schedule", default="2k,4k,8k")
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--profile", default="tiny", help="the simulated engine's profile ('fast': unpaced)")
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=len(os.sched_getaffinity(0)) >= 2,
        help="the engine on one core, the client on another (default where there are two)",
    )
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    engine_core, client_core = (cores[-1], cores[0]) if args.pin else (None, None)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sim = subprocess.Popen(
        [*rampwatch_cmd(), "sim", "--profile", args.profile, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        preexec_fn=on_core(engine_core),
    )
    try:
        wait_up(url, sim)
        with tempfile.TemporaryDirectory() as tmp:
            rec = Path(tmp) / "check.jsonl"
            started = time.monotonic()
            run = subprocess.run(
                [
                    *rampwatch_cmd(),
                    "run",
                    url,
                    "--headless",
                    "--gpu",
                    "none",
                    "--sessions",
                    str(args.sessions),
                    "--schedule",
                    args.schedule,
                    "--output-tokens",
                    str(args.output_tokens),
                    "--ignore-eos",
                    "--record",
                    str(rec),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=on_core(client_core),
            )
            took = time.monotonic() - started
            if run.returncode != 0:
                sys.exit(f"rampwatch run exited {run.returncode}: {run.stderr[-2000:]}")
            report = json.loads(
                subprocess.run(
                    [*rampwatch_cmd(), "report", str(rec), "--format", "json"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )
    finally:
        sim.terminate()
        sim.wait(10)
    turns = [t for s in report["sessions"] for t in s["turns"]]
    busy = sum(bool(t.get("client_busy")) for t in turns)
    tokens = sum(t.get("output_tokens") or 0 for t in turns)
    placed = f"engine on core {engine_core}, client on core {client_core}" if args.pin else "unpinned"
    print(
        f"sessions {args.sessions}, schedule {args.schedule} ({placed}): {len(turns)} turns, {tokens} output tokens, "
        f"{took:.1f} s"
    )
    own = sum(bool(t.get("client_busy_own")) for t in turns)
    print(f"turns marked client busy: {busy} (bar: 0), {own} of them by the driver's own work")
    worst, own_worst = ms(report.get("client_lag_max_ms")), ms(report.get("client_lag_own_max_ms"))
    print(f"worst driver loop lag: {worst}, its own work's: {own_worst}")
    idle = idle_loop_wakes(client_core, took)
    print(f"an idle loop alone on the client's core, {took:.0f} s of 10 ms sleeps: {idle}")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def idle_loop_wakes(core: int | None, seconds: float) -> str:
    """What the machine alone does to a loop: an asyncio loop that only sleeps 10 ms at a time, on the client's
    core, for as long as the run took; its wakes more than 5 ms late are the machine's (the OS, a VM's host)."""
    script = (
        "import asyncio, sys, time\n"
        "async def main(n):\n"
        "    late = []\n"
        "    for _ in range(n):\n"
        "        due = time.perf_counter() + 0.010\n"
        "        await asyncio.sleep(0.010)\n"
        "        late.append(time.perf_counter() - due)\n"
        "    print(sum(x > 0.005 for x in late), len(late), 1000 * max(late))\n"
        "asyncio.run(main(int(sys.argv[1])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(int(seconds / 0.0102))],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=on_core(core),
    ).stdout.split()
    return f"{out[0]} of {out[1]} wakes over 5 ms late, the worst {float(out[2]):.1f} ms"


if __name__ == "__main__":
    main()
