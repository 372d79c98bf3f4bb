#!/usr/bin/env python3
"""Fault figures: runs each fault scenario against the simulated engine and
prints a table: did the run go on, turns lost, events the run produced in
memory vs events in its recording. Asserts nothing; tests/test_faults.py does.

The bar: zero events lost in every case, no turn lost but the one the fault
hit (none at all with --retries), and no crash.

usage: python tests/bench_faults.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rampwatch.drivers.sim.faults import SimFaults  # noqa: E402
from tests.faults import FlakyFile, restart_server, run_scenario, wait_then  # noqa: E402


def disk_full_for(seconds: float):
    def act(holder, run):
        disk = run.hub.recorder._file = FlakyFile(run.hub.recorder._file, full=True)
        time.sleep(seconds)
        disk.full = False

    return wait_then(0.5, act)


def metrics_flip(holder, run):
    f = holder["sim"].sim.faults
    f.metrics = "malformed"
    time.sleep(1.0)
    f.metrics = "ok"


SCENARIOS = [
    ("clean run", {}),
    ("drop mid-stream", dict(faults=SimFaults(drop_after_tokens=5, drop_requests=1))),
    ("drop mid-stream, --retries 1", dict(faults=SimFaults(drop_after_tokens=5, drop_requests=1), retries=1)),
    ("HTTP 500", dict(faults=SimFaults(fail_requests=1, fail_status=500))),
    ("HTTP 503, --retries 1", dict(faults=SimFaults(fail_requests=1, fail_status=503), retries=1)),
    ("error chunk in stream", dict(faults=SimFaults(error_after_tokens=3, error_requests=1))),
    ("server gone 3 s and back", dict(time_scale=0.1, during=restart_server(down_for=3.0, after=1.5))),
    ("3 s stall before first byte", dict(faults=SimFaults(stall_s=3.0, stall_requests=1))),
    ("/metrics 404", dict(faults=SimFaults(metrics="404"), time_scale=0.5)),
    ("/metrics malformed", dict(faults=SimFaults(metrics="malformed"), time_scale=0.5)),
    ("/metrics slow (10 s)", dict(faults=SimFaults(metrics="slow"), time_scale=0.1)),
    ("/metrics changes shape", dict(time_scale=0.2, during=wait_then(0.8, metrics_flip))),
    ("disk full for 1.5 s", dict(time_scale=0.2, during=disk_full_for(1.5))),
    ("NVML missing (--gpu auto)", dict(gpu="auto")),
]


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    print(f"{'fault':<32}{'exit':>5}{'went on':>9}{'turns lost':>12}{'events':>8}{'recorded':>10}{'lost':>6}")
    for name, kw in SCENARIOS:
        out = run_scenario(name.replace(" ", "-").replace("/", ""), tmp, **kw)
        went_on = out.exit_code in (0, 1) and out.turns_ok >= len(out.run.cfg.schedule)
        print(
            f"{name:<32}{out.exit_code:>5}{'yes' if went_on else 'NO':>9}{out.turns_lost:>12}"
            f"{out.emitted:>8}{out.recorded:>10}{out.events_lost:>6}"
        )
    print(
        "\n(2 sessions x 4 turns each; 'turns lost' counts turns that did not complete; "
        "'lost' = events produced but not in the recording.)\nSIGINT/SIGTERM/SIGKILL: see tests/test_faults.py "
        "(20 random SIGKILLs, every file readable)."
    )


if __name__ == "__main__":
    main()
