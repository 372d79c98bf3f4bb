"""How often the UI redraws by default: the app's own default and the --refresh flag's, kept below both."""

from __future__ import annotations

# Two UI redraws a second: figures stay fresh to the eye, and a two-session ramp writes ~3 KB/s to a 120x40
# terminal (tests/bench_terminal.py), light enough for an SSH link through a jump host.
REFRESH_S = 0.5
