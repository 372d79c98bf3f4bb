#!/usr/bin/env python3
"""Interference figures end to end: the driver against the glm-like simulated
engine in real (scaled) time, through HTTP, the client's clock and the report.
Prints the figures and the bars they should meet; asserts nothing, because a
busy machine moves real-time figures. tests/test_experiments.py checks the same
phenomena on the engine's virtual clock, where they cannot move.

The bars: in lockstep, the slower session waits >= 1.5x the faster from turn 3
on and 1.6-2.1x at turn 10; decode gaps while the other session prefills are
> 3x those while decoding alone; a ramp's summed TTFT is within 15% of a fresh
1M one-shot's, and its longest single wait under a fifth of it; the engine's
own queued + prefill account for every turn's client TTFT within 5 ms.

usage: python tests/bench_experiments.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rampwatch.drivers.client.ramp import SEED_SCHEDULE  # noqa: E402
from rampwatch.drivers.model.analysis import build_report  # noqa: E402
from rampwatch.drivers.sim.profiles import make_profile  # noqa: E402
from tests.conftest import drive, rampwatch_cmd  # noqa: E402
from tests.simhost import ThreadedSim  # noqa: E402


def lockstep_demo() -> None:
    t0 = time.monotonic()
    with ThreadedSim(make_profile("glm-like", time_scale=50.0)) as s:
        run = drive(s.url, sessions=2, schedule=list(SEED_SCHEDULE), output_tokens=64, ignore_eos=True, lockstep=True)
    rep = build_report(run.state)
    ratios = {x.turn: x.ratio for x in rep.turn_spread}
    gaps = rep.interference
    during, alone = gaps.gaps_during_foreign_prefill.p50_s, gaps.gaps_alone.p50_s
    print(f"lockstep, 2 sessions, glm-like x50 ({time.monotonic() - t0:.1f} s, exit {run.exit_code})")
    print("  slowest/fastest TTFT per turn: " + "  ".join(f"{k}:{v:.2f}" for k, v in sorted(ratios.items())))
    print(
        f"  turns 3-10 >= 1.5: {all(ratios.get(k, 0) >= 1.5 for k in range(3, 11))}; "
        f"turn 10 in 1.6-2.1: {1.6 <= ratios.get(10, 0) <= 2.1}"
    )
    print(
        f"  decode gap p50 during the other's prefill {during * 1000:.1f} ms, alone {alone * 1000:.1f} ms "
        f"({during / alone:.1f}x; bar > 3x)"
    )


def ramp_against_one_shot() -> None:
    t0 = time.monotonic()
    with ThreadedSim(make_profile("glm-like", time_scale=200.0)) as s:
        run = drive(s.url, schedule=list(SEED_SCHEDULE), output_tokens=16, ignore_eos=True, one_shot=True)
    vs = build_report(run.state).one_shot.ramps[0]
    print(f"ramp vs one-shot, glm-like x200 ({time.monotonic() - t0:.1f} s, exit {run.exit_code})")
    print(
        f"  summed TTFT / one-shot TTFT {vs.sum_ratio:.2f} (bar 0.85-1.15); "
        f"longest wait / one-shot {vs.longest_ratio:.3f} (bar < 0.2)"
    )


def engine_accounts_for_ttft() -> None:
    """`rampwatch demo` as tests/test_engine_timing.py runs it, longer: the client's part of each turn's TTFT once the
    engine's queued, prefill and modelled front end are taken off (the span's own TTFT), in wall seconds (the demo's
    modelled times over its speed-up)."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp) / "demo.jsonl"
        demo = ["demo", "--headless", "--schedule", "8k,16k,24k,32k,40k", "--time-scale", "5", "--output-tokens", "8"]
        subprocess.run([*rampwatch_cmd(), *demo, "--record", str(rec)], check=True, capture_output=True)
        rep = json.loads(
            subprocess.run(
                [*rampwatch_cmd(), "report", str(rec), "--format", "json"], check=True, capture_output=True
            ).stdout
        )
    k = rep["run"]["time_scale"]
    turns = [t for s in rep["sessions"] for t in s["turns"]]
    rests = sorted(t["ttft_client_s"] / k for t in turns if not t["client_busy"] and t["ttft_client_s"] is not None)
    print(f"the engine's account of each TTFT, demo x{k:g}, 2 sessions ({time.monotonic() - t0:.1f} s)")
    print(
        f"  client's part per turn (wall ms): median {1000 * rests[len(rests) // 2]:.1f}, "
        f"max {1000 * rests[-1]:.1f} over {len(rests)} turns ({len(turns) - len(rests)} marked client busy); "
        "bar: every turn <= 5 ms"
    )


if __name__ == "__main__":
    lockstep_demo()
    ramp_against_one_shot()
    engine_accounts_for_ttft()
