"""The decode chart: decode tokens/s per session over time, and the helpers that place its seconds
(shared with the session screen's chart)."""

from __future__ import annotations

import math

from rich.console import Group
from rich.text import Text

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.ttft_split import WaitPart
from rampwatch.drivers.model.views import GENERATING, TIMELINE_BUCKET_S, SessionView
from rampwatch.tui.fmt import sparkline
from rampwatch.tui.widgets.base import Panel

SETTLE_S = 0.5  # a second is drawn this long after it ends: token times reach the UI in batches (~0.3 s)


def last_whole_second(state: RunState, now: float) -> int:
    """The newest bucket a decode chart draws: whole seconds only, so it changes once a second."""
    step = TIMELINE_BUCKET_S
    return int(now // step) if state.ended else int((now - SETTLE_S) // step) - 1


def chart_start(last: int, width: int) -> int:
    """The first bucket a chart of `width` cells shows, its newest bucket `last` inside it. The chart
    moves a quarter of its width at a time, not a cell a second: between moves only the newest column
    changes, so a terminal is sent a few cells a second instead of the whole chart. It fills from
    the run's start."""
    stride = max(1, width // 4)
    overflow = last - (width - 1)
    return -(-overflow // stride) * stride if overflow > 0 else 0


# A finished turn the engine timed: its own wait's cells, queued (light shade) told from prefill (dark shade) by
# glyph, not hue, and where its span gave the engine's own TTFT, the server's front end (template, tokenizer:
# seconds at 1M tokens) told from both; the client's side (milliseconds) stays blank as every untimed wait does.
WAIT_GLYPHS: dict[WaitPart, tuple[str, str]] = {
    "front end": ("▒", "dim cyan"),
    "queued": ("░", "dim yellow"),
    "prefill": ("▓", "yellow"),
}
WAIT_KEYS: tuple[tuple[WaitPart, str, str], ...] = (  # (part, its words, its words where narrow)
    ("front end", "server front end", "front end"),
    ("queued", "queued in the engine", "queued"),
    ("prefill", "engine prefill", "prefill"),
)


def prefill_legend(lead: str, timed: bool = False, width: int = 0, front_end: bool = False) -> Text:
    """The chart's key; `timed`: the run has turns the engine timed, whose own waits show queued and prefill
    cells (in the words that fit `width`); `front_end`: some of them show the server's front end too."""
    legend = Text(lead, style="dim")
    legend.append("  ", style="on #5f0000")
    legend.append(" another session prefilling", style="dim")
    if timed:
        keys = [k for k in WAIT_KEYS if front_end or k[0] != "front end"]
        short = len(legend) + sum(4 + len(words) for _, words, _ in keys) > width
        for part, words, narrow in keys:
            glyph, style = WAIT_GLYPHS[part]
            legend.append(f"  {glyph}", style=style)
            legend.append(f" {narrow if short else words}", style="dim")
    return legend


def wait_fills(s: SessionView, start: float, step: float, n: int) -> list[tuple[str, str] | None]:
    """The glyph each of n cells shows where the session's own timed wait covers it."""
    return [None if part is None else WAIT_GLYPHS.get(part) for part in s.wait_cells(start, step, n)]


class TimelinePanel(Panel):
    """Decode tokens/s per session over time, one cell per second; red cells:
    another session was prefilling; where the engine timed a finished turn,
    its own wait's cells: ░ queued in the engine, ▓ the engine's prefill. It draws whole seconds only, so it is
    rebuilt once a second, not on every tick."""

    LABEL = 13

    _cache_key: tuple[object, ...] | None = None
    _cached: object = None

    def render_state(self, state: RunState, now: float) -> object:
        if not state.sessions:
            return Text("")
        last = last_whole_second(state, now)
        key = (last, self.size, self.compact, len(state.sessions), id(state))
        if key != self._cache_key:
            self._cache_key, self._cached = key, self._draw(state, last, now)
        return self._cached

    def _draw(self, state: RunState, last: int, now: float) -> object:
        width = max(10, self.size.width - self.LABEL)
        step = TIMELINE_BUCKET_S
        first = chart_start(last, width)
        start = first * step
        space = max(1, self.size.height - (0 if self.compact else 1))  # rows for lanes (the legend takes one)
        sessions = list(state.sessions.values())
        aggregate = len(sessions) > space
        lanes = self._by_interest(sessions, now)[: max(0, space - 2)] if aggregate else sessions
        rows = 1 if self.compact or aggregate else max(1, min(10, space // max(1, len(lanes))))
        out = []
        spans = panels.prefills_in_window(state, start, start + width * step, now)
        for s in lanes:
            values = s.timeline_values(first, width)
            marks = panels.foreign_prefill_cells(state, s.id, start, step, width, now, spans)
            top = max(values) or 1.0
            fills = wait_fills(s, start, step, width) if s.waits else None
            for k, line in enumerate(sparkline(values, top, marks, rows=rows, fills=fills)):
                label = f"{s.id:<5}{top:>6.0f}▕ " if k == 0 else f"{'':11}▕ "
                out.append(Text(label, style="bold" if k == 0 else "dim") + line)
        if aggregate:
            p50, low = panels.timeline_aggregate(state, first, width)
            marks = panels.foreign_prefill_cells(state, "", start, step, width, now, spans)  # any session prefilling
            top = max(p50) or 1.0
            out.append(Text(f"{'p50':<5}{top:>6.0f}▕ ", style="bold") + sparkline(p50, top, marks)[0])
            if space >= 2:
                out.append(Text(f"{'min':<11}▕ ", style="bold") + sparkline(low, top, marks)[0])
        if not self.compact:
            lanes_note = f"lanes: {len(lanes)}/{len(sessions)}, p50/min of all  " if aggregate else ""
            lead = f"{'':5}peak tok/s, 1 cell = {step:g}s  {lanes_note}"
            out.append(prefill_legend(lead, bool(state.engine_timed), self.size.width, state.front_end_timed))
        return Group(*out)

    @staticmethod
    def _by_interest(sessions: list[SessionView], now: float) -> list[SessionView]:
        """Who gets a lane when not all fit: those prefilling (longest wait
        first), then those decoding slowest, then the rest, latest to finish
        a turn first (a trace's thousands of finished sessions last)."""

        def key(s: SessionView) -> tuple[int, float]:
            if s.state == "prefilling" and s.current is not None:
                return (0, s.current.sent_t)
            if s.state in GENERATING:
                return (1, s.decode_rate_now() or 0.0)
            last = s.last_done.done_t if s.last_done is not None and s.last_done.done_t is not None else -math.inf
            return (3 if s.state == "done" else 2, -last)

        return sorted(sessions, key=key)
