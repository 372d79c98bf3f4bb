"""How fast, and in how much memory, `rampwatch trace info` reads a large trace: a generated Mooncake trace of
100K rows (tests/make_traces.py), read in a subprocess as a user runs it; prints the wall seconds and the
process's peak RSS beside their bars (under 10 s, under 500 MB).

    .venv/bin/python tests/bench_trace_info.py [--rows 100000] [--kv-tokens 1m] [--repeats 1] [--seed 35]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.conftest import rampwatch_cmd  # noqa: E402
from tests.make_traces import mooncake_large  # noqa: E402

WALL_BAR_S = 10.0
RSS_BAR_MB = 500.0


def run_once(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of one run of `command`: the child is reaped with wait4, which
    gives its own resource usage (getrusage over children would keep the largest of every run so far)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"trace info failed ({proc.returncode}): {err.read().decode().strip()}")
        return wall, usage.ru_maxrss / 1024, out.read().decode()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="rows in the generated trace (default 100000)")
    p.add_argument("--kv-tokens", default="1m", help="the pool for the LRU ideal (default 1m)")
    p.add_argument("--repeats", type=int, default=1, help="runs, each its own process (default 1)")
    p.add_argument("--seed", type=int, default=35, help="the generator's seed (default 35)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "mooncake-large.jsonl"
        started = time.perf_counter()
        with open(trace, "w", encoding="utf-8") as f:
            mooncake_large(args.rows, args.seed, f)
        made = time.perf_counter() - started
        size_mb = trace.stat().st_size / 1e6
        print(f"trace: {args.rows:,} Mooncake rows, {size_mb:.1f} MB, generated in {made:.1f} s")
        command = [*rampwatch_cmd(), "trace", "info", str(trace), "--kv-tokens", args.kv_tokens]
        out = ""
        for k in range(args.repeats):
            wall, rss, out = run_once(command)
            bars = f"wall {wall:.2f} s (bar < {WALL_BAR_S:.0f} s)  peak RSS {rss:.0f} MB (bar < {RSS_BAR_MB:.0f} MB)"
            verdict = "ok" if wall < WALL_BAR_S and rss < RSS_BAR_MB else "OVER THE BAR"
            print(f"run {k + 1}: {bars}  {verdict}")
        print(out, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
