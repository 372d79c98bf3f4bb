#!/usr/bin/env python3
"""What the UI costs the measurement: prints figures, asserts nothing.

Against the simulated engine ('tiny' profile, in its own process), the same
run twice in one script run, as a user runs it:

  1. headless   `rampwatch run URL --sessions 16 --scale-to 16k --ignore-eos
                 --output-tokens 256 --headless`
  2. UI         the same command with the UI, in a real terminal (tmux at
                160x50); the driver runs in its own process

For each: TTFT overhead per turn = (client TTFT summed over the turns - the
engine's own TTFT histogram sum over the same requests) / turns; the CPU of
the client processes; and for the UI run the UI process's CPU while the run
streams and while the finished run sits on screen (10 s).
Bars (issue 8): UI TTFT overhead within 1 ms/turn of headless; UI process
<= 15% of a core while 16 sessions stream at 10 refreshes/s, <= 3% with a
finished run on screen.

With --many (issue 15): 64 sessions streaming under the UI at 120x40 (UI
process CPU; bar <= 25% of a core), then 256 sessions: how long a key press
takes to show on screen (`?` until the help screen is drawn, read with tmux
capture-pane; bar <= 200 ms) and the UI process's memory over the run
(bounded: the state keeps per-session windows, not every token).

usage: python tests/bench_ui.py [--sessions 16] [--scale-to 16k] [--output-tokens 256] [--repeats 3] [--many]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.sim.serve import ChildSim
from rampwatch.drivers.telemetry.metrics import normalize
from rampwatch.tui.cli.files import load_state

ROOT = Path(__file__).resolve().parents[1]
RAMPWATCH = str(Path(sys.executable).parent / "rampwatch")
ON_SCREEN_S = 10.0


def server_ttft(url: str) -> tuple[float, float]:
    """(sum, count) of the engine's own TTFT histogram."""
    _, values, _ = normalize(httpx.get(url + "/metrics", timeout=10).text)
    return values["ttft_sum"], values["ttft_count"]


def client_ttft(record: Path) -> tuple[float, int, float | None]:
    """(summed TTFT, turns, median decode tok/s) from the run's recording."""
    rep = build_report(load_state(record, skip_bad_lines=False))
    rows = [t for s in rep.sessions for t in s.turns if t.ttft_s is not None]
    rates = [t.decode_tok_s for t in rows if t.decode_tok_s]
    return sum(t.ttft_s for t in rows), len(rows), statistics.median(rates) if rates else None


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def run_args(url: str, args: argparse.Namespace, record: Path) -> list[str]:
    return [
        RAMPWATCH,
        "run",
        url,
        "--sessions",
        str(args.sessions),
        "--scale-to",
        args.scale_to,
        "--ignore-eos",
        "--output-tokens",
        str(args.output_tokens),
        "--gpu",
        "none",
        "--record",
        str(record),
    ]


def headless(url: str, args: argparse.Namespace, record: Path) -> dict:
    before = server_ttft(url)
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [*run_args(url, args, record), "--headless"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    after = server_ttft(url)
    total, turns, decode = client_ttft(record)
    return {
        "code": p.returncode,
        "wall": wall,
        "turns": turns,
        "decode": decode,
        "overhead_ms": (total - (after[0] - before[0])) / turns * 1000,
        "server_turns": after[1] - before[1],
        "client_cpu": usage.ru_utime + usage.ru_stime,
    }


def _recorded(record: Path, needle: bytes) -> bool:
    return record.exists() and needle in record.read_bytes()


def pane_process(session: str) -> psutil.Process:
    """The process a tmux session's pane runs."""
    pid = subprocess.run(
        ["tmux", "display", "-p", "-t", session, "#{pane_pid}"], capture_output=True, text=True, check=True
    ).stdout
    return psutil.Process(int(pid))


def with_ui(url: str, args: argparse.Namespace, record: Path) -> dict:
    """The same run in tmux at 160x50; the UI process is the pane's process, the driver its child."""
    session = f"rw-bench-{os.getpid()}"
    command = " ".join(run_args(url, args, record))
    before = server_ttft(url)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50", f"exec {command}"], check=True)
    try:
        ui = pane_process(session)
        deadline = time.monotonic() + 60
        while not ui.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        driver = ui.children()[0]
        while not _recorded(record, b'"RequestSent"'):
            time.sleep(0.02)
        ui0, drv0, t0 = cpu(ui), cpu(driver), time.perf_counter()
        driver_cpu = 0.0
        while not _recorded(record, b'"RunEnded"'):
            try:
                driver_cpu = cpu(driver) - drv0
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.1)
        ui1, t1 = cpu(ui), time.perf_counter()
        time.sleep(ON_SCREEN_S)
        ui2, t2 = cpu(ui), time.perf_counter()
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        ui.wait(timeout=60)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    after = server_ttft(url)
    total, turns, decode = client_ttft(record)
    return {
        "wall": t1 - t0,
        "turns": turns,
        "decode": decode,
        "overhead_ms": (total - (after[0] - before[0])) / turns * 1000,
        "server_turns": after[1] - before[1],
        "ui_streaming": (ui1 - ui0) / (t1 - t0),
        "ui_finished": (ui2 - ui1) / (t2 - t1),
        "driver_cpu": driver_cpu,
    }


def _screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def key_latency(session: str, key: str, shows: str, back: str) -> float:
    """Seconds from sending `key` until the screen shows `shows` (then `back` closes it again)."""
    t0 = time.perf_counter()
    subprocess.run(["tmux", "send-keys", "-t", session, key], check=True)
    while shows not in _screen(session):
        if time.perf_counter() - t0 > 10:
            return float("inf")
        time.sleep(0.005)
    took = time.perf_counter() - t0
    subprocess.run(["tmux", "send-keys", "-t", session, back], check=True)
    while shows in _screen(session) and time.perf_counter() - t0 < 20:
        time.sleep(0.01)
    return took


def many(url: str, folder: Path, sessions: int, scale_to: str, output_tokens: int, presses: int) -> dict:
    """The UI at 120x40 over `sessions` sessions: its CPU while they stream, key latency, memory."""
    session = f"rw-many-{os.getpid()}"
    record = folder / f"many-{sessions}.jsonl"
    command = " ".join(
        [
            RAMPWATCH,
            "run",
            url,
            "--sessions",
            str(sessions),
            "--scale-to",
            scale_to,
            "--ignore-eos",
            "--output-tokens",
            str(output_tokens),
            "--gpu",
            "none",
            "--record",
            str(record),
        ]
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", f"exec {command}"], check=True)
    try:
        ui = pane_process(session)
        while not _recorded(record, b'"FirstToken"'):
            time.sleep(0.05)
        rss0, cpu0, t0 = ui.memory_info().rss, cpu(ui), time.perf_counter()
        latencies = []
        for _ in range(presses):
            time.sleep(1.0)
            latencies.append(key_latency(session, "?", "rampwatch keys", "Escape"))
        rss_peak = rss0
        while not _recorded(record, b'"RunEnded"'):
            rss_peak = max(rss_peak, ui.memory_info().rss)
            time.sleep(0.5)
        cpu1, t1, rss1 = cpu(ui), time.perf_counter(), ui.memory_info().rss
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        ui.wait(timeout=60)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return {
        "sessions": sessions,
        "ui_cpu": (cpu1 - cpu0) / (t1 - t0),
        "wall": t1 - t0,
        "latencies": latencies,
        "rss0": rss0,
        "rss_peak": rss_peak,
        "rss_end": rss1,
    }


def main_many(args: argparse.Namespace, folder: Path, sim_url: str) -> None:
    a = many(sim_url, folder, 64, "8k", 128, presses=0)
    b = many(sim_url, folder, 256, "4k", 64, presses=8)
    print("UI in tmux at 120x40, simulated 'tiny' engine\n")
    for r in (a, b):
        lat = sorted(r["latencies"])
        lat_text = (
            f"key → screen median {statistics.median(lat) * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms; " if lat else ""
        )
        print(
            f"{r['sessions']:>4} sessions: UI {r['ui_cpu'] * 100:.1f}% "
            f"of a core over {r['wall']:.0f} s streaming; {lat_text}"
            f"UI RSS {r['rss0'] / 2**20:.0f} MB at the first token, peak {r['rss_peak'] / 2**20:.0f} MB, "
            f"{r['rss_end'] / 2**20:.0f} MB at the end"
        )
    print(f"\nUI process CPU with 64 sessions streaming: {a['ui_cpu'] * 100:.1f}% of a core  (bar <= 25%)")
    print(f"key press answered with 256 sessions: max {max(b['latencies']) * 1000:.0f} ms  (bar <= 200 ms)")
    print(f"recordings: {folder}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--scale-to", default="16k")
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="headless/UI pairs to run, alternating (default 3)")
    ap.add_argument("--many", action="store_true", help="issue 15's figures: 64 and 256 sessions under the UI")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        raise SystemExit("bench_ui needs tmux (apt-get install tmux): the UI runs in a real terminal")
    folder = Path(tempfile.mkdtemp(prefix="rw-bench-ui-"))
    sim_args = argparse.Namespace(profile="tiny")
    pairs = []
    if args.many:
        with ChildSim(sim_args) as sim:
            return main_many(args, folder, sim.url)
    with ChildSim(sim_args) as sim:
        for k in range(args.repeats):
            h = headless(sim.url, args, folder / f"headless-{k}.jsonl")
            u = with_ui(sim.url, args, folder / f"ui-{k}.jsonl")
            pairs.append((h, u))
    print(
        f"{args.sessions} sessions, --scale-to {args.scale_to}, "
        f"{args.output_tokens} output tokens, simulated 'tiny' engine; "
        f"UI in tmux at 160x50\n"
    )
    print(
        f"{'run':<10}{'turns':>6}{'wall s':>8}{'TTFT overhead ms/turn':>23}{'decode tok/s':>14}{'client CPU s':>14}"
        f"{'UI % core':>11}{'finished % core':>17}"
    )
    for h, u in pairs:
        print(
            f"{'headless':<10}{h['turns']:>6}{h['wall']:>8.1f}{h['overhead_ms']:>23.2f}{h['decode'] or 0:>14.1f}"
            f"{h['client_cpu']:>14.2f}{'-':>11}{'-':>17}"
        )
        print(
            f"{'UI':<10}{u['turns']:>6}{u['wall']:>8.1f}{u['overhead_ms']:>23.2f}{u['decode'] or 0:>14.1f}"
            f"{u['driver_cpu']:>14.2f}{u['ui_streaming'] * 100:>11.1f}{u['ui_finished'] * 100:>17.1f}"
        )
    diffs = [u["overhead_ms"] - h["overhead_ms"] for h, u in pairs]
    ui_stream = max(u["ui_streaming"] for _, u in pairs) * 100
    ui_done = max(u["ui_finished"] for _, u in pairs) * 100
    print("\n(UI run: client CPU = the driver process; UI % core = the UI process while the run streams)")
    print(
        "TTFT overhead with the UI minus headless, median of "
        f"{len(diffs)} pairs: {statistics.median(diffs):+.2f} ms/turn "
        f"[{', '.join(f'{d:+.2f}' for d in diffs)}]  (bar: within ±1)"
    )
    print(f"UI process CPU while {args.sessions} sessions stream (worst run): {ui_stream:.1f}% of a core  (bar <= 15%)")
    print(f"UI process CPU with the finished run on screen (worst run): {ui_done:.1f}% of a core  (bar <= 3%)")
    bad = [h for h, _ in pairs if h["code"] != 0]
    if bad:
        print(f"note: {len(bad)} headless run(s) exited non-zero")
    print(f"recordings: {folder}")


if __name__ == "__main__":
    main()
