"""The Sessions panel: an aggregate line, the column heads, then one row per
session, sorted and filtered. It draws only the rows on screen (Textual's
line API), so 256 sessions cost what 30 do; it scrolls with the keyboard
and the mouse, and its cursor picks the session `enter` opens. A trace's
thousands of sessions come and go: its finished ones are counted in the
aggregate line, not listed (the filter `done` lists them)."""

from __future__ import annotations

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.gaps import STALL_S
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.views import GENERATING, NO_ANSWER, SessionState, SessionView
from rampwatch.tui.fmt import duration, format_tokens, pct, rate
from rampwatch.tui.widgets.dirty import Cell, cells, dirty_regions

STATE_STYLE: dict[SessionState, str] = {
    "queued": "dim",
    "prefilling": "bold yellow",
    "reasoning": "bold magenta",
    "decoding": "bold green",
    "idle": "cyan",
    "user idle": "italic cyan",
    "failed": "bold red",
    "done": "bold blue",
    "cancelled": "magenta",
}
STATE_ORDER: dict[str, int] = {
    s: k
    for k, s in enumerate(
        ("prefilling", "reasoning", "decoding", "queued", "user idle", "idle", "failed", "cancelled", "done")
    )
}
COLUMNS = (
    ("", 5, "<"),
    ("turn", 5, ">"),
    ("ctx", 5, ">"),
    ("state", 16, "<"),
    ("TTFT", 6, ">"),
    ("tok/s", 6, ">"),
    ("stall", 6, ">"),
    ("hit", 4, ">"),
)
# A trace run's hit column reads measured/ideal (62%/97%): what the server's cache gave, and what the trace allowed.
TRACE_COLUMNS = (*COLUMNS[:-1], ("hit/ideal", 9, ">"))


def heads(columns: tuple[tuple[str, int, str], ...]) -> Text:
    line = " ".join(f"{n:{a}{w}}" for n, w, a in columns) + " needle"
    return Text(line, style="bold", no_wrap=True, overflow="ellipsis")


HEADS, TRACE_HEADS = heads(COLUMNS), heads(TRACE_COLUMNS)
CURSOR_STYLE = Style(bgcolor="grey30")


def _natural(s: SessionView) -> tuple[int, str]:
    return (len(s.id), s.id)  # s2 before s10


def _last_ttft(s: SessionView) -> float:
    return s.last_done.ttft if s.last_done is not None and s.last_done.ttft is not None else -1.0


# The `s` key cycles through these: (name, key, descending).
SORTS = (
    ("id", _natural, False),
    ("state", lambda s: (STATE_ORDER.get(s.state, 9), _natural(s)), False),
    ("TTFT", _last_ttft, True),
    ("tok/s", lambda s: s.decode_rate_now() if s.state in GENERATING else float("inf"), False),
    ("turn", lambda s: (s.turn, _natural(s)), False),
)


def stall_cell(s: SessionView, now: float) -> tuple[str, bool]:
    """(text, stalled): the gap since the last token while it exceeds
    STALL_S (a stall in progress), else the turn's longest gap so far."""
    gap = s.current_gap(now)
    if gap is not None and gap > STALL_S:
        return duration(gap), True
    rec = s.current or s.last_done
    return (duration(rec.max_gap) if rec is not None and rec.max_gap else "-"), False


def moved_mark(moves: int) -> str:
    """A session that moved to another backend behind a router: ⇄ and how often (⇄ alone past 9)."""
    return "" if not moves else f"⇄{moves}" if moves <= 9 else "⇄"


NEEDLE_MARK = {True: ("✓", "green"), False: ("✗", "bold red"), NO_ANSWER: ("∅", "bold yellow")}


def needle_marks(needles: list[bool | str | None], room: int) -> Text:
    """One mark per turn (✓ found, ✗ missed, ∅ no answer: cut before answering) when they fit, else
    found/asked and the last mark."""
    if not needles:
        return Text()  # no turn finished yet (however narrow the panel)
    if len(needles) <= room:
        out = Text()
        for n in needles:
            out.append(*NEEDLE_MARK.get(n, ("·", "bold red")))
        return out
    found = sum(1 for n in needles if n is True)
    mark, _ = NEEDLE_MARK.get(needles[-1], ("✗", ""))
    return Text(f"{mark}{found}/{len(needles)}", style="green" if found == len(needles) else "bold red")


def session_row(
    s: SessionView, now: float, width: int, place: tuple[str, str] | None = None, trace: bool = False
) -> Text:
    """`place`: where a prefill/decode split has the turn (RunState.turn_place); `trace`: the hit column says the
    ideal beside it."""
    label = s.state
    if s.state == "prefilling" and s.current is not None:
        label = f"{place[0] if place else 'prefilling'} {duration(s.current.prefill_elapsed(now))}"
    elif (paused := s.user_idle(now)) is not None:
        label = f"user idle {duration(paused)}"  # the user's pause (--think-time), never the model's
    last = s.last_done
    tok_s = s.decode_rate_now() if s.state in GENERATING else None
    stall, stalled = stall_cell(s, now)
    cells = (
        "1shot" if s.role == "one-shot" else s.id + moved_mark(s.moves),
        f"{s.turn}/{len(s.schedule)}",
        format_tokens(s.context_tokens),
        label,
        duration(last.ttft if last is not None else None),
        f"{tok_s:.1f}" if tok_s is not None else "-",
        stall,
        f"{pct(s.hit_rate)}/{pct(s.ideal_hit_rate)}" if trace else pct(s.hit_rate),
    )
    columns = TRACE_COLUMNS if trace else COLUMNS
    line = Text(no_wrap=True, overflow="ellipsis")
    for (_, w, align), cell in zip(columns, cells):
        style = STATE_STYLE.get(s.state, "") if cell is label else ("bold red" if cell is stall and stalled else "")
        if s.moves and cell is cells[0]:
            style = "bold yellow"  # it left its first backend: its hit rate may say why
        line.append(f"{cell:{align}{w}} "[: w + 1], style=style)
    line.append_text(needle_marks(s.needles, width - sum(w + 1 for _, w, _ in columns)))
    return line


def aggregate_lines(state: RunState, width: int) -> list[Text]:
    """Sessions by state, then TTFT p50/max of the last turns and decode tok/s
    p50/min now: one line when it fits, else two."""
    a = panels.aggregate(state)
    counts = Text(no_wrap=True, overflow="ellipsis")
    counts.append(counted(a.total, "session"), style="bold")
    if a.arrivals is not None:
        arrived, live, waiting = a.arrivals
        counts.append(f" · arrived {arrived:,} · live {live:,} · waiting {waiting:,}")
    for name in ("decoding", "reasoning", "prefilling", "queued", "user idle", "idle", "done", "failed", "cancelled"):
        if a.by_state.get(name):
            counts.append(" · ")
            counts.append(f"{a.by_state[name]:,} {name}", style=STATE_STYLE.get(name, ""))  # type: ignore[call-overload]
    figures = Text(
        f"TTFT p50 {duration(a.ttft_p50)} max {duration(a.ttft_max)} · "
        f"tok/s p50 {rate(a.decode_p50)} min {rate(a.decode_min)}",
        style="dim",
        no_wrap=True,
        overflow="ellipsis",
    )
    if counts.cell_len + 2 + figures.cell_len <= width:
        return [counts + Text("  ") + figures]
    return [counts, figures]


class SessionsTable(ScrollView, can_focus=True):
    """See the module doc. The app calls `show(state, now)` on its tick."""

    BINDINGS = [
        Binding("up", "move(-1)", "up", show=False),
        Binding("down", "move(1)", "down", show=False),
        Binding("pageup", "move(-10)", show=False),
        Binding("pagedown", "move(10)", show=False),
        Binding("enter", "open", "focus session"),
    ]

    class Open(Message):
        """The user asked for one session's own screen."""

        def __init__(self, session: str):
            super().__init__()
            self.session = session

    def __init__(self, title: str, **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.border_title = title
        self.sort_index = 0
        self.filter = ""
        self.cursor: str | None = None  # the selected session's id: it stays selected when rows move
        self.rows: list[SessionView] = []
        self._state: RunState | None = None
        self._trace = False  # a trace run: the hit column says the ideal beside it
        self._now = 0.0
        self._top: list[Text] = []  # the fixed lines above the rows: the aggregate and the column heads
        self._text_console = Console(width=1000, color_system="truecolor", legacy_windows=False)
        self._drawn: tuple[list[list[Cell]], int, Size] | None = None  # the cells last shown, at that scroll and size

    @property
    def sort_name(self) -> str:
        return SORTS[self.sort_index][0]

    def cycle_sort(self) -> str:
        self.sort_index = (self.sort_index + 1) % len(SORTS)
        return self.sort_name

    def show(self, state: RunState, now: float) -> None:
        self._state, self._now = state, now
        self._trace = state.header is not None and state.header.trace is not None
        rows = list(state.sessions.values())
        folded = 0
        if self._trace and not self.filter:  # the live ones; the finished are a count in the aggregate line
            live = [s for s in rows if s.state != "done"]
            folded, rows = len(rows) - len(live), live
        if self.filter:
            needle = self.filter.lower()
            rows = [
                s
                for s in rows
                if needle in s.state or needle in s.id.lower() or (needle in "one-shot" and s.role == "one-shot")
            ]
        _, key, descending = SORTS[self.sort_index]
        self.rows = sorted(rows, key=key, reverse=descending)  # type: ignore[arg-type]
        if self.rows and (self.cursor is None or all(s.id != self.cursor for s in self.rows)):
            self.cursor = self.rows[0].id
        head = TRACE_HEADS if self._trace else HEADS
        self._top = [*aggregate_lines(state, self.size.width), head] if state.sessions else []
        self.virtual_size = Size(self.size.width, len(self.rows) + self.fixed_lines)
        title = f"Sessions · by {self.sort_name}" + (
            f" · filter '{self.filter}' ({len(self.rows)}/{len(state.sessions)})" if self.filter else ""
        )
        if folded:
            title += f" · {folded} done, not listed (/done lists them)"
        if self.border_title != title:
            self.border_title = title
        self._refresh_changed_lines()

    def _refresh_changed_lines(self) -> None:
        """Repaint only the cells that changed since the last show: a ticking stall timer costs its own
        few cells on the terminal, not the row's or the table's."""
        lines = [cells(self.render_line(y)) for y in range(self.size.height)]
        old, self._drawn = self._drawn, (lines, self.scroll_offset.y, self.size)
        if old is None or old[1:] != self._drawn[1:]:
            self.refresh()
            return
        for region in dirty_regions(old[0], lines):
            self.refresh(region)

    @property
    def fixed_lines(self) -> int:
        return len(self._top)

    def _cursor_index(self) -> int:
        return next((i for i, s in enumerate(self.rows) if s.id == self.cursor), 0)

    def action_move(self, step: int) -> None:
        if not self.rows:
            return
        i = min(len(self.rows) - 1, max(0, self._cursor_index() + step))
        self.cursor = self.rows[i].id
        visible = max(1, self.size.height - self.fixed_lines)
        top = self.scroll_offset.y
        if i < top:
            self.scroll_to(y=i, animate=False)
        elif i >= top + visible:
            self.scroll_to(y=i - visible + 1, animate=False)
        self.refresh()

    def action_open(self) -> None:
        if self.cursor is not None:
            self.post_message(self.Open(self.cursor))

    def on_click(self, event) -> None:  # noqa: ANN001
        i = self.scroll_offset.y + event.y - self.fixed_lines
        if event.y >= self.fixed_lines and 0 <= i < len(self.rows):
            self.cursor = self.rows[i].id
            self.refresh()

    def row_text(self, i: int) -> Text:
        s = self.rows[i]
        place = panels.turn_place(self._state, s) if self._state else None
        return session_row(s, self._now, self.size.width, place, self._trace)

    def lines_text(self) -> list[str]:
        """What the panel shows now, as plain lines (for tests)."""
        return [self._line_text(y).plain for y in range(self.size.height)]

    def _line_text(self, y: int) -> Text:
        state = self._state
        if state is None or not state.sessions:
            empty = (
                "no sessions (watch mode)" if state and state.header and state.header.mode == "watch" else "starting…"
            )
            return Text(empty if y == 0 else "", style="dim")
        if y < self.fixed_lines:
            return self._top[y].copy()
        i = self.scroll_offset.y + y - self.fixed_lines
        if i >= len(self.rows):
            return Text("")
        line = self.row_text(i)
        if self.rows[i].id == self.cursor and self.has_focus:
            line.stylize(CURSOR_STYLE)
        return line

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        text = self._line_text(y)
        text.truncate(width, overflow="ellipsis")
        segments = [s for s in text.render(self._text_console) if s.text != "\n"]
        return Strip(segments).extend_cell_length(width).crop(0, width) if segments else Strip([Segment(" " * width)])
