#!/usr/bin/env python3
"""How long a run's picture takes: folds and renders the HTML page of the
shipped glm-like recording and of a 2-hour, 32-session ramp to 1M tokens (15K
events, metrics twice a second), and prints the time and the page's size.
Asserts nothing: a busy machine moves the time; tests/test_export.py checks
the pages themselves.

The bar: under 2 s each, the fold included, and under 5 MB.

usage: python tests/bench_picture.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_export import GLM, build_report, long_run, picture, read_recording, summary_lines  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shipped = read_recording(GLM)
    for name, (head, events) in (("shipped glm-like 2x1M", (shipped.header, shipped.events)),
                                 ("2 h, 32 sessions", long_run())):
        for k in range(args.repeats):
            t0 = time.perf_counter()
            series = picture.fold(head, events)
            page = picture.run_html(series, summary_lines(build_report(series.state)))
            took = time.perf_counter() - t0
            print(f"{name}, run {k + 1}: {len(events)} events folded and drawn in {took:.2f} s (bar 2 s), "
                  f"page {len(page.encode()) / 1e6:.2f} MB (bar 5 MB)")


if __name__ == "__main__":
    main()
