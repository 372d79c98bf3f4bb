"""The header bar: one line with the mode, the run clock, model, engine, server and the recording."""

from __future__ import annotations

from rich.text import Text

from rampwatch.drivers.model.client_check import RecentLag
from rampwatch.drivers.model.goodput import per_min
from rampwatch.drivers.model.modelled import speed_up
from rampwatch.drivers.model.state import RunState
from rampwatch.tui.fmt import clock
from rampwatch.tui.widgets.base import ChangingStatic


def client_lag_text(lag: RecentLag) -> str:
    """`client lag 12ms`; `(os)`: the machine woke the loop late, not its own work; `(w3, os)`: worker 3's loop,
    the worst of several."""
    whose = f"w{lag.worker}" if lag.worker is not None else ""
    cause = ", ".join(c for c in (whose, "os" if lag.machines else "") if c)
    return f"client lag {lag.ms:.0f}ms" + (f" ({cause})" if cause else "")


def per_min_text(rate: float | None) -> str:
    return f" {rate:.1f}/min" if rate is not None else ""


class HeaderBar(ChangingStatic):
    """One line: mode, run clock, model, engine, server, recording path or its trouble."""

    def show(self, state: RunState, now: float, mode: str, recording: str | None) -> None:
        self.show_content(header_text(state, now, mode, recording))


def header_text(state: RunState, now: float, mode: str, recording: str | None) -> Text:
    """The header's line, from the state's figures (a function of its own: tests read it without an app)."""
    h = state.header
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" rampwatch ", style="bold reverse")
    alarm = "silent" in mode or "crashed" in mode
    t.append(
        f" {mode} ",
        style="bold white on red" if alarm else "bold black on yellow" if "replay" in mode else "bold black on green",
    )
    t.append(f" {clock(now)} ", style="bold")
    lag = state.client.recent_lag(now)
    if lag is not None:  # the driver's own stamps may be late by as much: said before anything else
        t.append(f" {client_lag_text(lag)} ", style="bold black on yellow")
    if h is not None:
        modes = [
            m
            for m in (
                "lockstep" if h.lockstep else "",
                "strict needle" if h.needle_mode == "strict" else "",
                "one-shot" if h.one_shot else "",
                f"reasoning {h.reasoning}" if h.reasoning != "auto" else "",
                f"max {h.max_tokens} tok" if h.max_tokens else "",
                f"arrivals {h.arrivals_per_s * 60:g}/min · {state.late_turns} late" if h.arrivals_per_s else "",
                f"trace {h.trace.speed:g}x {h.trace.timing} · {state.late_turns} late" if h.trace is not None else "",
            )
            if m
        ]
        if h.time_limit_s:
            limit = state.modelled_time(h.time_limit_s)  # the limit is wall clock; `now` is modelled
            modes.append(f"limit {clock(limit)}" + (" reached" if now >= limit else ""))
        if state.time_scale != 1.0:
            modes.append(speed_up(state.time_scale))
        if modes:
            t.append(f" {' · '.join(modes)} ", style="bold cyan")
        g = state.goodput
        if g.judged:
            share = g.window_share(now)
            last = f" · {share:.0%} last 5m" if share is not None else ""
            minutes = state.steady.minutes(now)
            met_conv = g.conversations_met
            turns, conv = per_min_text(per_min(g.met, minutes)), per_min_text(per_min(met_conv, minutes))
            t.append(
                f" SLO met {g.met}/{g.judged} turns{turns} · {met_conv} conv{conv}{last} ",
                style="bold magenta",
            )
        engine = (h.engine or state.server.engine or "?") + (f" {h.engine_version}" if h.engine_version else "")
        more = sum(1 for ep in h.endpoints if ep.url) - 1
        t.append(f" {h.model or '?'} · {engine} · {h.server}" + (f" +{more} more" if more > 0 else ""))
    if recording:
        t.append(f"  rec {recording}", style="dim")
    if h is not None and not h.tls_verified:
        t.append("  TLS NOT VERIFIED", style="bold white on red")
    if state.recording_error:
        t.append(f"  {state.recording_error}", style="bold white on red")
    ended = state.ended
    if ended is not None and ended.status == "crashed":
        t.append(f"  CRASHED: {ended.error or 'driver gone'}", style="bold white on red")
    return t
