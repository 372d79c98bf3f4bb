"""Line output for scripts and CI: the same lines live and in replay."""

from __future__ import annotations

import sys
from typing import TextIO

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import panels
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.turn_text import log_text
from rampwatch.tui.fmt import clock, pct, rate, whole

PROGRESS_EVERY_S = 10.0


class HeadlessPrinter:
    """Prints every new log entry of the state, and while a prefill is in
    flight a progress line every PROGRESS_EVERY_S seconds."""

    def __init__(self, state: RunState, out: TextIO = sys.stdout):
        self.state, self.out = state, out
        self.seen = 0
        self._last_progress = 0.0

    def __call__(self, _event: ev.AnyEvent | None = None) -> None:
        state = self.state
        if state.log.total != self.seen:
            for entry in state.log.new_since(self.seen):
                tag = "" if entry.level in ("info", "mark") else f"{entry.level.upper()}: "
                print(f"[{clock(entry.t)}] {tag}{log_text(entry)}", file=self.out, flush=True)
            self.seen = state.log.total

    def progress(self, now: float) -> None:
        """Called on a timer: say how long each waiting prefill has been waiting."""
        if now - self._last_progress < self.state.modelled_time(PROGRESS_EVERY_S):  # every 10 s of wall clock
            return
        self._last_progress = now
        for rec in self.state.prefilling():
            print(
                f"[{clock(now)}] {rec.session} turn {rec.turn}: prefill in flight {rec.prefill_elapsed(now) or 0:.0f}s "
                f"(~{rec.new_tokens_est:,} new tokens)",
                file=self.out,
                flush=True,
            )
        arrivals = panels.aggregate(self.state).arrivals if self.state.sessions else None
        if arrivals is not None:
            arrived, live, waiting = arrivals
            print(f"[{clock(now)}] arrived {arrived} · live {live} · waiting {waiting}", file=self.out, flush=True)
        if self.state.header is not None and self.state.header.mode == "watch":
            print(f"[{clock(now)}] {server_line(self.state)}", file=self.out, flush=True)


def server_line(state: RunState) -> str:
    """The server panel in one line, for watch mode without a UI."""
    srv = state.server
    if srv.last_sample_t is None:
        errors = "; ".join(panels.metrics_errors(state).values())
        return f"server: no metrics yet{' (' + errors + ')' if errors else ''}"
    v = srv.values
    return (
        f"server: KV {pct(v.get('kv_usage'))} · running "
        f"{whole(v.get('running'))} · waiting {whole(v.get('waiting'))} · "
        f"hit {pct(panels.hit_rate_since_start(state))} · prefill {rate(srv.prefill_rate)} tok/s · "
        f"decode {rate(srv.decode_rate)} tok/s"
    )
