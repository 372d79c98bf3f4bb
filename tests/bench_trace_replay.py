"""Whether the driver keeps up with a trace, and in how much memory: a generated Mooncake trace of short
two-turn sessions (10,000 of them, asking for 50 requests a second) replayed with `rampwatch run --headless
--trace ... --trace-timing open` against the fast simulated engine (`rampwatch sim --profile fast`, its own
process), as a user runs it. Prints the send lag (each turn's first send after its due time, from the
recording) at p50, p99 and max beside its bar (p99 under 50 ms), and the rampwatch process's peak RSS (driver,
fold and line output in one process, headless) beside its bar (under 500 MB).

    .venv/bin/python tests/bench_trace_replay.py [--sessions 10000] [--rate 50] [--speed 1] [--seed 35]
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rampwatch.drivers.model.stats import quantile  # noqa: E402
from tests.conftest import answers, free_port, rampwatch_cmd  # noqa: E402
from tests.make_traces import mooncake_paced  # noqa: E402

LAG_BAR_MS = 50.0
RSS_BAR_MB = 500.0


def start_sim(port: int) -> subprocess.Popen:
    sim = subprocess.Popen(
        [*rampwatch_cmd(), "sim", "--profile", "fast", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not answers(f"http://127.0.0.1:{port}/v1/models"):
        if time.monotonic() > deadline or sim.poll() is not None:
            sim.kill()
            raise SystemExit("the simulated engine did not start")
        time.sleep(0.2)
    return sim


def replay(command: list[str]) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS in MB) of the replay, reaped with wait4 for its own peak."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):
            out.seek(0)
            raise SystemExit(f"the replay failed ({proc.returncode}): {out.read().decode()[-2000:]}")
        return proc.returncode, wall, usage.ru_maxrss / 1024


def send_lags(record: Path) -> tuple[list[float], int, int]:
    """Each turn's first send after its due time (seconds), the turns sent, and the turns that failed."""
    lags, failed = [], 0
    for line in record.open("rb"):
        e = json.loads(line)
        kind = e.get("type")
        if kind == "RequestSent" and e.get("attempt", 1) == 1 and e.get("due") is not None:
            lags.append(e["t"] - e["due"])
        elif kind == "TurnDone" and e.get("status") != "ok":
            failed += 1
    return lags, len(lags), failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=10_000, help="sessions in the trace, two turns each (10000)")
    p.add_argument("--rate", type=float, default=50.0, help="requests a second the trace asks for (default 50)")
    p.add_argument("--speed", type=float, default=1.0, help="--trace-speed of the replay (default 1)")
    p.add_argument("--seed", type=int, default=35, help="the generator's seed (default 35)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trace, record = Path(folder) / "paced.jsonl", Path(folder) / "replay.jsonl"
        with open(trace, "w", encoding="utf-8") as f:
            mooncake_paced(args.sessions, args.rate, args.seed, f)
        rows = sum(1 for _ in trace.open("rb"))
        print(f"trace: {args.sessions:,} sessions, {rows:,} requests at {args.rate:g}/s, replayed at {args.speed:g}x")
        port = free_port()
        sim = start_sim(port)
        try:
            command = [
                *rampwatch_cmd(), "run", f"http://127.0.0.1:{port}", "--headless", "--gpu", "none",
                "--trace", str(trace), "--trace-timing", "open", "--trace-speed", str(args.speed),
                "--record", str(record),
            ]  # fmt: skip
            code, wall, rss_mb = replay(command)
        finally:
            sim.kill()
            sim.wait()
        lags, sent, failed = send_lags(record)
    lags.sort()
    p50, p99, worst = (quantile(lags, q) * 1000 for q in (0.5, 0.99, 1.0))
    rate = sent / wall if wall > 0 else 0.0
    print(f"replay: exit {code}, {sent:,} turns sent ({failed} failed) in {wall:.0f} s, {rate:.1f} turns/s overall")
    verdict = "under" if p99 < LAG_BAR_MS else "OVER"
    print(f"send lag: p50 {p50:.1f} ms, p99 {p99:.1f} ms ({verdict} the {LAG_BAR_MS:.0f} ms bar), max {worst:.1f} ms")
    verdict = "under" if rss_mb < RSS_BAR_MB else "OVER"
    print(f"peak RSS: {rss_mb:.0f} MB ({verdict} the {RSS_BAR_MB:.0f} MB bar)")
    return 0 if p99 < LAG_BAR_MS and rss_mb < RSS_BAR_MB and sent == rows else 1


if __name__ == "__main__":
    sys.exit(main())
