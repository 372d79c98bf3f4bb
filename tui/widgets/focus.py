"""One session's own screen (`enter` on a session, `escape` back): its
per-turn table (prefill history, decode, gaps, needle), and its decode lane
at full height with the other sessions' prefills shaded."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turn_row import turn_row
from rampwatch.drivers.model.views import TIMELINE_BUCKET_S
from rampwatch.drivers.present.turn_table import row_cells, shown_columns
from rampwatch.tui.fmt import sparkline
from rampwatch.tui.widgets.base import ChangingStatic
from rampwatch.tui.widgets.sessions import session_row
from rampwatch.tui.widgets.timeline import last_whole_second, prefill_legend, wait_fills

# The report's per-turn columns that one session's screen has room for (the same heads, the same cells).
TURN_COLUMNS = (
    "turn",
    "context",
    "new",
    "cached",
    "transferred",
    "xfer s",
    "TTFT s",
    "queued s",
    "engine prefill s",
    "rest s",
    "front end s",
    "client s",
    "TTFA s",
    "prefill tok/s",
    "decode tok/s",
    "gap p99",
    "max gap",
    ">100ms",
    "hit",
    "served by",
    "ideal",
    "reuse eff",
    "spec",
    "reasoning",
    "answer",
    "needle",
    "client",
    "late ms",
    "SLO",
)


class SessionScreen(Screen[None]):
    """The focused session; the app refreshes it on its tick while it is shown."""

    BINDINGS = [Binding("escape", "back", "back")]

    def __init__(self, session: str):
        super().__init__()
        self.session = session
        self._turns_shown = -1  # the state's turns_revision the table shows
        self._lane_key: tuple[object, ...] | None = None
        self._columns: tuple[str, ...] = ()  # the table's columns: the reasoning ones join once a turn reasoned

    def compose(self) -> ComposeResult:
        yield ChangingStatic(id="focus-head")
        yield DataTable(id="focus-turns", zebra_stripes=True, cursor_type="row")
        lane = ChangingStatic(id="focus-lane")
        lane.border_title = "Decode tokens/s"
        yield lane
        yield Footer()

    def action_back(self) -> None:
        self.app.pop_screen()
        self.app.call_after_refresh(self.app.redraw)  # type: ignore[attr-defined]

    def show(self, state: RunState, now: float) -> None:
        s = state.sessions.get(self.session)
        head = self.query_one("#focus-head", ChangingStatic)
        if s is None:
            head.show_content(Text(f"{self.session}: no such session in this run", style="bold red"))
            return
        trace = state.header is not None and state.header.trace is not None
        head.show_content(session_row(s, now, max(40, self.size.width - 2), trace=trace))
        if state.turns_revision != self._turns_shown:  # a turn more, or a finished one settled since
            self._turns_shown = state.turns_revision
            rows = [turn_row(rec) for rec in state.turns if rec.session == self.session]
            columns = shown_columns(rows, TURN_COLUMNS)
            table = self.query_one(DataTable)
            table.clear(columns=columns != self._columns)
            if columns != self._columns:
                self._columns = columns
                table.add_columns(*columns)
            for row in rows:
                table.add_row(*row_cells(row, columns))
        self._show_lane(state, now)

    def _show_lane(self, state: RunState, now: float) -> None:
        lane = self.query_one("#focus-lane", ChangingStatic)
        step = TIMELINE_BUCKET_S
        last = last_whole_second(state, now)
        key = (last, lane.size)
        if key == self._lane_key:
            return
        self._lane_key = key
        s = state.sessions[self.session]
        width = max(10, lane.size.width - 8)
        first = last - (width - 1)
        values = s.timeline_values(first, width)
        marks = panels.foreign_prefill_cells(state, s.id, first * step, step, width, now)
        top = max(values) or 1.0
        fills = wait_fills(s, first * step, step, width) if s.waits else None
        rows = max(1, lane.size.height - 1)
        lines = [
            Text(f"{top:>6.0f}▕ " if k == 0 else f"{'':6}▕ ", style="dim") + spark
            for k, spark in enumerate(sparkline(values, top, marks, rows=rows, fills=fills))
        ]
        legend = prefill_legend(
            f"  1 cell = {step:g}s  ", bool(state.engine_timed), lane.size.width, state.front_end_timed
        )
        lane.show_content(Group(*lines, legend))
