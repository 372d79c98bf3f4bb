#!/usr/bin/env python3
"""Hours of turns in minutes: the soak (and, with --chaos, the chaos run) of
issue 13. Prints figures, asserts nothing.

64 sessions ramp to about 1M tokens against the simulated 'glm-like' engine at
a high time scale, then keep talking near 1M (a thousand tokens a turn) for
--plateau-turns more turns, so every turn after the ramp costs the same and
memory can be judged flat. The run is the UI as a user runs it (`rampwatch
run ...` in tmux at 120x40; the driver is its own process).

Printed: every minute the RSS of the driver and the UI, the recording's size,
turns done and events/s; at the end the bars:
  - RSS growth between the first and last quarter after warm-up (every
    session on its plateau) < 10%, driver and UI;
  - zero events lost: every request has one outcome, every finished turn its
    first token and all its token times (the recording checked line by line);
  - recording size linear in turns (bytes per turn, first vs last quarter).

--chaos flips the engine's fault knobs at random times (every 6-12 s; each
kind once in a random order, then at random) through POST /sim/faults (HTTP
500/503, a dropped stream, an error chunk, a stall, /metrics 404/malformed/
slow), restarts the engine (killed, port closed, back 3 s later; at most
--restarts times, as each makes every session re-prefill ~1M tokens, hence
--request-timeout 900) and fills the recording's disk (a tmpfs, filled then
freed; needs root to mount, else skipped with a line saying so). Each counted fault is injected
alone and waited on until it has hit a request. Bars: every turn no fault hit
completes; the report's failed turns equal the injected faults that hit turns
plus the attempts in flight at a restart (which the session then retries, as
an outage); zero events lost.

usage: python tests/bench_soak.py [--sessions 64] [--plateau-turns 60] [--time-scale 500] [--chaos] [--seed 1]
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import psutil

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.serve import child_argv

RAMPWATCH = str(Path(sys.executable).parent / "rampwatch")
RAMP = [32, 64, 128, 256, 512, 768, 900]  # k tokens: the ramp, then the plateau from 900k a thousand at a time


def soak_schedule(plateau_turns: int) -> list[int]:
    ramp = [k * 1024 for k in RAMP]
    return ramp + [ramp[-1] + 1024 * (i + 1) for i in range(plateau_turns)]


class Engine:
    """The simulated engine in a child process on a fixed loopback port, which
    a restart really closes (clients see refused connections while it is down)."""

    def __init__(self, time_scale: float, sessions: int):
        self.args = argparse.Namespace(profile="glm-like", time_scale=time_scale, kv_tokens=sessions * 1_100_000)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(1024)
        fd = self.sock.fileno()
        self.proc = subprocess.Popen(
            child_argv(self.args, [fd]),
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit("simulated engine did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.sock.close()

    def faults(self, **knobs: object) -> dict:
        return httpx.post(self.url + "/sim/faults", json=knobs, timeout=10).json()


class Disk:
    """A small tmpfs for the recording, so the chaos run can fill it for real."""

    def __init__(self, path: Path, size_mb: int):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True
        )
        self.mounted = r.returncode == 0
        self.why = r.stderr.strip() or "mount failed"

    def fill_for(self, seconds: float) -> int:
        """Fill the disk to the last byte, hold it full, free it; returns bytes written."""
        ballast, written = self.path / "ballast", 0
        with open(ballast, "wb") as f:
            block = b"\0" * (1 << 20)
            try:
                while True:
                    written += f.write(block)
                    f.flush()
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        time.sleep(seconds)
        ballast.unlink()
        return written

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


@dataclass
class Chaos:
    engine: Engine
    disk: Disk | None
    rng: random.Random
    log: list[tuple[float, str, str]] = field(default_factory=list)  # (wall time, fault, outcome)
    restarts: list[tuple[float, float]] = field(default_factory=list)  # (down, up) wall times
    hit: dict[str, int] = field(default_factory=dict)  # counted faults that hit a request
    stop: threading.Event = field(default_factory=threading.Event)
    max_restarts: int = 2

    COUNTED = {
        "HTTP 500": dict(fail_status=500, fail_requests=1),
        "HTTP 503": dict(fail_status=503, fail_requests=1),
        "dropped stream": dict(drop_after_tokens=5, drop_requests=1),
        "error chunk": dict(error_after_tokens=3, error_requests=1),
    }
    COUNTERS = {
        "HTTP 500": "fail_requests",
        "HTTP 503": "fail_requests",
        "dropped stream": "drop_requests",
        "error chunk": "error_requests",
    }

    def loop(self) -> None:
        kinds = [*self.COUNTED, "stall 2 s", "metrics 404", "metrics malformed", "metrics slow", "engine restart"]
        if self.disk is not None and self.disk.mounted:
            kinds.append("disk full")
        first = self.rng.sample(kinds, len(kinds))  # every kind once, in a random order; then any
        while not self.stop.wait(self.rng.uniform(6, 12)):
            if len(self.restarts) >= self.max_restarts and "engine restart" in kinds:
                kinds.remove("engine restart")  # each costs every session a full re-prefill of ~1M tokens
            kind = first.pop(0) if first else self.rng.choice(kinds)
            now = time.time()
            try:
                outcome = self.inject(kind)
            except httpx.HTTPError as e:
                outcome = f"not injected ({type(e).__name__})"
            self.log.append((now, kind, outcome))

    def inject(self, kind: str) -> str:
        e = self.engine
        if kind in self.COUNTED:
            e.faults(**self.COUNTED[kind])
            counter = self.COUNTERS[kind]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not self.stop.is_set():
                if e.faults()[counter] == 0:
                    self.hit[kind] = self.hit.get(kind, 0) + 1
                    return "hit a request"
                time.sleep(0.05)
            e.faults(**{counter: 0})
            return "withdrawn (no request came)"
        if kind == "stall 2 s":
            e.faults(stall_s=2.0, stall_requests=1)
            return "next request stalls 2 s"
        if kind.startswith("metrics"):
            e.faults(metrics=kind.split()[1])
            time.sleep(5)
            e.faults(metrics="ok")
            return "/metrics faulty for 5 s"
        if kind == "engine restart":
            down = time.time()
            e.kill()
            time.sleep(3)
            e.start()
            self.restarts.append((down, time.time()))
            return "killed, back after 3 s"
        assert self.disk is not None
        return f"{self.disk.fill_for(5) / 2**20:.0f} MB ballast for 5 s"


@dataclass
class Sample:
    at: float
    driver_rss: int
    ui_rss: int
    size: int
    turns: int
    events: int


def processes(root: psutil.Process) -> tuple[psutil.Process | None, psutil.Process | None]:
    """(UI, driver) among the tmux pane's processes."""
    ui = driver = None
    for p in [root, *root.children(recursive=True)]:
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "rampwatch.drivers.run.child" in line:
            driver = p
        elif "rampwatch run" in line or line.endswith(" run") or " run http" in line:
            ui = p
    return ui, driver


def count(record: Path) -> tuple[int, int, bool]:
    """(turns finished, events, run ended) from the recording so far."""
    try:
        data = record.read_bytes()
    except FileNotFoundError:
        return 0, 0, False
    return data.count(b'"TurnDone"'), data.count(b"\n") - 1, b'"RunEnded"' in data


def rss(p: psutil.Process | None) -> int:
    try:
        return p.memory_info().rss if p else 0
    except psutil.Error:
        return 0


def lost_events(events: list) -> list[str]:
    """What the recording lacks: a request without exactly one outcome, a
    finished turn without its first token or with token times missing."""
    problems: list[str] = []
    open_req: dict[str, ev.RequestSent] = {}
    first: set[tuple[str, int, int]] = set()
    times: dict[tuple[str, int], int] = {}
    for e in events:
        if isinstance(e, ev.RequestSent):
            if e.session in open_req:
                problems.append(
                    f"{e.session} turn {e.turn}: a request sent while turn {open_req[e.session].turn} had no outcome"
                )
            open_req[e.session] = e
            times[(e.session, e.turn)] = 0
        elif isinstance(e, ev.FirstToken):
            first.add((e.session, e.turn, 0))
        elif isinstance(e, ev.TokenTimes):
            times[(e.session, e.turn)] = times.get((e.session, e.turn), 0) + len(e.chunk_times())
        elif isinstance(e, ev.TurnDone):
            sent = open_req.pop(e.session, None)
            if sent is None or sent.turn != e.turn:
                problems.append(f"{e.session} turn {e.turn}: an outcome without its request")
            if e.status == "ok":
                if (e.session, e.turn, 0) not in first:
                    problems.append(f"{e.session} turn {e.turn}: no first token")
                if times.get((e.session, e.turn), 0) != e.chunks:
                    problems.append(
                        f"{e.session} turn {e.turn}: {times.get((e.session, e.turn), 0)} "
                        f"token times of {e.chunks} chunks"
                    )
            first.discard((e.session, e.turn, 0))
    problems += [f"{s} turn {r.turn}: a request without an outcome" for s, r in open_req.items()]
    if not events or not isinstance(events[-1], ev.RunEnded):
        problems.append("no RunEnded at the end")
    return problems


def marginal(window: list[Sample]) -> float:
    """Recording bytes per turn added over a window of samples."""
    return (window[-1].size - window[0].size) / max(1, window[-1].turns - window[0].turns)


def quarters(values: list[float]) -> tuple[float, float]:
    q = max(1, len(values) // 4)
    return statistics.mean(values[:q]), statistics.mean(values[-q:])


def drive(
    args: argparse.Namespace, engine: Engine, record: Path, chaos: Chaos | None
) -> tuple[list[Sample], float, str]:
    schedule = ",".join(str(n) for n in soak_schedule(args.plateau_turns))
    session = f"rw-soak-{os.getpid()}"
    command = (
        f"{RAMPWATCH} run {engine.url} --sessions {args.sessions} --schedule {schedule} --output-tokens 32 "
        f"--ignore-eos --gpu none --record {record} --request-timeout 900 --reconnect-timeout 120"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", command], check=True)
    samples: list[Sample] = []
    screen = ""
    try:
        pane = psutil.Process(
            int(
                subprocess.run(
                    ["tmux", "display", "-p", "-t", session, "#{pane_pid}"], capture_output=True, text=True, check=True
                ).stdout
            )
        )
        ui = driver = None
        t0 = time.time()
        next_print = t0 + args.print_every
        print(
            f"{'min':>5}{'driver RSS MB':>15}{'UI RSS MB':>11}{'recording MB':>14}{'turns':>7}{'events/s':>10}",
            flush=True,
        )
        chaos_thread = None
        while True:
            if ui is None or driver is None:
                ui, driver = processes(pane)
            turns, events, ended = count(record)
            if chaos is not None and chaos_thread is None and turns > 0:
                chaos_thread = threading.Thread(target=chaos.loop, daemon=True)
                chaos_thread.start()
            s = Sample(
                time.time() - t0, rss(driver), rss(ui), record.stat().st_size if record.exists() else 0, turns, events
            )
            samples.append(s)
            if ended:
                break
            if time.time() >= next_print:
                prev = samples[-1 - min(len(samples) - 1, int(args.print_every / args.sample_every))]
                rate = (s.events - prev.events) / max(1e-9, s.at - prev.at)
                print(
                    f"{s.at / 60:>5.0f}{s.driver_rss / 2**20:>15.0f}{s.ui_rss / 2**20:>11.0f}{s.size / 2**20:>14.1f}"
                    f"{s.turns:>7}{rate:>10.0f}",
                    flush=True,
                )
                next_print += args.print_every
            time.sleep(args.sample_every)
        if chaos is not None:
            chaos.stop.set()
            if chaos_thread is not None:
                chaos_thread.join(timeout=90)
        time.sleep(2)
        screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        if ui is not None:
            ui.wait(timeout=60)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return samples, time.time() - t0, screen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--plateau-turns", type=int, default=60, help="turns near 1M after the ramp (default 60)")
    ap.add_argument(
        "--time-scale", type=float, default=500.0, help="engine speed-up over the modelled GPU (default 500)"
    )
    ap.add_argument("--chaos", action="store_true", help="inject faults at random times (see above)")
    ap.add_argument("--seed", type=int, default=1, help="random seed for the chaos schedule")
    ap.add_argument(
        "--restarts",
        type=int,
        default=2,
        help="most engine restarts in a chaos run (default 2: each makes all 64 sessions re-prefill ~1M tokens)",
    )
    ap.add_argument("--sample-every", type=float, default=5.0, help=argparse.SUPPRESS)
    ap.add_argument("--print-every", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not shutil.which("tmux"):
        raise SystemExit("bench_soak needs tmux (apt-get install tmux): the UI runs in a real terminal")
    folder = Path(tempfile.mkdtemp(prefix="rw-soak-"))
    disk = Disk(folder / "disk", 256) if args.chaos else None
    record = (disk.path if disk and disk.mounted else folder) / "soak.jsonl"
    engine = Engine(args.time_scale, args.sessions)
    chaos = Chaos(engine, disk, random.Random(args.seed), max_restarts=args.restarts) if args.chaos else None
    schedule = soak_schedule(args.plateau_turns)
    print(
        f"{'chaos' if chaos else 'soak'}: {args.sessions} sessions x {len(schedule)} turns "
        f"({RAMP[0]}k..{RAMP[-1]}k, then +1k to {schedule[-1] // 1024}k), simulated glm-like engine at "
        f"{args.time_scale:g}x, UI in tmux at 120x40",
        flush=True,
    )
    if disk is not None and not disk.mounted:
        print(f"disk full: skipped, cannot mount a tmpfs here ({disk.why})")
    try:
        samples, wall, screen = drive(args, engine, record, chaos)
        back = read_recording(record)
    finally:
        engine.kill()
        if disk is not None:
            saved = folder / "soak.jsonl"
            if disk.mounted and record.exists():
                shutil.copy(record, saved)
                record = saved
            disk.unmount()
    report(args, back, samples, wall, screen, chaos, record, len(schedule))


def report(
    args: argparse.Namespace,
    back,
    samples: list[Sample],
    wall: float,
    screen: str,
    chaos: Chaos | None,
    record: Path,
    turns_each: int,
) -> None:
    events = back.events
    state = RunState(back.header)
    for e in events:
        state.apply(e)
    modelled = events[-1].t * args.time_scale if events else 0.0
    print(f"\nfinal screen:\n{screen}")
    ramp_turns = len(RAMP)
    warm = next((i for i, s in enumerate(samples) if s.turns >= args.sessions * ramp_turns), len(samples))
    after = samples[warm:]
    total_turns = sum(1 for e in events if isinstance(e, ev.TurnDone))
    print(
        f"wall {wall / 60:.1f} min = {modelled / 3600:.1f} h of the modelled engine; {total_turns} turn outcomes, "
        f"{len(events)} events ({len(events) / wall:.0f}/s), recording {record.stat().st_size / 2**20:.1f} MB"
    )
    if len(after) >= 4:
        for name, attr in (("driver", "driver_rss"), ("UI", "ui_rss")):
            a, b = quarters([getattr(s, attr) for s in after])
            print(
                f"{name} RSS after warm-up ({after[0].at / 60:.1f} min on): first quarter {a / 2**20:.0f} MB, "
                f"last quarter {b / 2**20:.0f} MB, growth {100 * (b - a) / a:+.1f}%  (bar < 10%)"
            )
        q = max(1, len(after) // 4)
        a, b = (marginal(after[: q + 1]), marginal(after[-q - 1 :]))
        print(
            f"recording bytes per turn: first quarter {a:.0f}, last "
            f"quarter {b:.0f} ({100 * (b - a) / a:+.1f}%)  (linear: ~0)"
        )
    else:
        print("too few samples after warm-up to judge memory; run longer (--plateau-turns)")
    peak = max(samples, key=lambda s: s.driver_rss)
    print(
        f"driver RSS peak: {peak.driver_rss / 2**20:.0f} MB at "
        f"{peak.at / 60:.1f} min (sampled every {args.sample_every:g} s)"
    )
    problems = lost_events(events)
    print(f"events lost: {len(problems)}  (bar 0)" + "".join(f"\n  {p}" for p in problems[:10]))
    final: dict[tuple[str, int], str] = {}
    for e in events:
        if isinstance(e, ev.TurnDone):
            final[(e.session, e.turn)] = e.status
    ok = sum(1 for v in final.values() if v == "ok")
    failed_final = sum(1 for v in final.values() if v == "failed")
    attempts_failed = sum(s.failed_turns for s in state.sessions.values())
    print(
        f"turns: {ok} ok, {failed_final} failed, {args.sessions * turns_each - len(final)} never ran; "
        f"run status {state.ended.status if state.ended else 'none'}"
    )
    if chaos is None:
        return
    print("\nfaults injected (wall clock, kind, outcome):")
    for at, kind, outcome in chaos.log:
        print(f"  {datetime.fromtimestamp(at).strftime('%H:%M:%S')}  {kind:<18} {outcome}")
    counted = sum(chaos.hit.values())
    outage = outage_attempts(events)
    origin = datetime.fromisoformat(back.header.started_at).timestamp()
    stray = [t for t in outage if not any(d - origin - 1 <= t <= u - origin + 5 for d, u in chaos.restarts)]
    print(
        f"counted faults that hit a request: {counted} ({', '.join(f'{k} {v}' for k, v in sorted(chaos.hit.items()))})"
    )
    print(f"turns failed at the end: {failed_final}  (bar: = counted faults, {counted})")
    print(
        f"failed attempts in the report: {attempts_failed} = {counted} counted + {len(outage)} in flight at "
        f"{len(chaos.restarts)} restarts (retried as outages; {len(stray)} outside a restart window)  "
        f"{'OK' if attempts_failed == counted + len(outage) and not stray else 'MISMATCH'}"
    )
    all_done = ok + failed_final == len(final) and failed_final == counted and args.sessions * turns_each == len(final)
    print(f"every turn no fault hit completed: {'yes' if all_done else 'NO'}")


def outage_attempts(events: list) -> list[float]:
    """Times of failed attempts the session then re-sent as the same attempt (an outage, not a retry)."""
    out: list[float] = []
    pending: dict[str, ev.TurnDone] = {}
    attempt: dict[str, int] = {}
    for e in events:
        if isinstance(e, ev.RequestSent):
            done = pending.pop(e.session, None)
            if done is not None and done.turn == e.turn and attempt.get(e.session) == e.attempt:
                out.append(done.t)
            attempt[e.session] = e.attempt
        elif isinstance(e, ev.TurnDone) and e.status == "failed":
            pending[e.session] = e
        elif isinstance(e, ev.TurnDone):
            pending.pop(e.session, None)
    return out


if __name__ == "__main__":
    main()
