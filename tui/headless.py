"""Line output for scripts and CI: the same lines live and in replay."""

from __future__ import annotations

import sys
from typing import TextIO

from drivers import events as ev
from drivers.state import RunState

PROGRESS_EVERY_S = 10.0


def _clock(t: float) -> str:
    m, s = divmod(int(t), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


class HeadlessPrinter:
    """Prints every new log entry of the state, and while a prefill is in
    flight a progress line every PROGRESS_EVERY_S seconds."""

    def __init__(self, state: RunState, out: TextIO = sys.stdout):
        self.state, self.out = state, out
        self.seen = 0
        self._last_progress = 0.0

    def __call__(self, _event: ev.AnyEvent | None = None) -> None:
        state = self.state
        if state.log_total != self.seen:
            for t, level, text in state.new_log_entries(self.seen):
                tag = "" if level in ("info", "mark") else f"{level.upper()}: "
                print(f"[{_clock(t)}] {tag}{text}", file=self.out, flush=True)
            self.seen = state.log_total

    def progress(self, now: float) -> None:
        """Called on a timer: say how long each waiting prefill has been waiting."""
        if now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        for rec in self.state.prefilling():
            print(f"[{_clock(now)}] {rec.session} turn {rec.turn}: prefill in flight {now - rec.sent_t:.0f}s "
                  f"(~{rec.new_tokens_est:,} new tokens)", file=self.out, flush=True)
