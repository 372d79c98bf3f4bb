#!/usr/bin/env python3
"""How fast a run becomes a picture: prints seconds, asserts nothing.

  shipped   fold + HTML of recordings/glm-like-2x1m.sample.jsonl, and the whole `rampwatch export` command
  long      fold + HTML of a synthetic 2-hour, 32-session ramp to 1M tokens (metrics twice a second)

Bar (issue 9): each render under 2 s, the export command under 10 s, on this 2-core machine unloaded.

usage: python tests/bench_export.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.present import picture
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.drivers.run.recording import read_recording

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.folding import fold_state  # noqa: E402
from tests.test_export import GLM, long_run  # noqa: E402


def render_s(header, events) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    state = fold_state(header, events)
    picture.run_html(state, summary_lines(build_report(state)))
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rec = read_recording(GLM)
    head, events = long_run()
    rampwatch = str(Path(sys.executable).parent / "rampwatch")
    for k in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            subprocess.run(
                [rampwatch, "export", str(GLM), "--html", f"{tmp}/r.html", "--svg", f"{tmp}/r.svg"],
                check=True,
                capture_output=True,
            )
            command_s = time.perf_counter() - t0
        print(
            f"run {k + 1}: shipped render {render_s(rec.header, rec.events):.2f} s, export command {command_s:.2f} s, "
            f"2-hour 32-session render {render_s(head, events):.2f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
