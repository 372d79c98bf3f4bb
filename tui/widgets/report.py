"""The report screen (`r`): a table per session that sorts (click a column's
head) and scrolls, fitted to the terminal by dropping columns in a known
order; the summary and interference lines; TTFT per turn as bars."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.turn_row import TurnRow
from rampwatch.drivers.present.report import report_title
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.drivers.present.turn_table import BY_HEAD, row_cells, shown_columns

# Dropped first when the terminal is narrow; turn, context, TTFT, decode tok/s, max gap and needle stay.
DROP_ORDER = (
    *("front end s", "client s", "answer", "gap p50", ">1s", "reasoning", "out", "KV peak", "client", "error"),
    *("cached", "gap p99", ">100ms", "prefill tok/s", "new", "hit"),
)
BAR_WIDTH = 40


def fitted_columns(tables: list[list[TurnRow]], width: int) -> list[str]:
    """The report's columns that fit in `width` cells, dropping DROP_ORDER's first."""
    heads = shown_columns([r for rows in tables for r in rows])
    cells = [row_cells(r, heads) for rows in tables for r in rows]
    need = {c: max([len(c)] + [len(row[k]) for row in cells]) + 2 for k, c in enumerate(heads)}
    shown = list(heads)
    for name in DROP_ORDER:
        if sum(need[c] for c in shown) <= width:
            break
        if name in shown:
            shown.remove(name)
    return shown


def ttft_bars(rep: Report) -> Text:
    """Per turn, one bar per session, scaled to the longest TTFT of the run."""
    top = max((t.ttft_s or 0.0 for s in rep.sessions for t in s.turns), default=0.0) or 1.0
    out = Text()
    turns = sorted({t.turn for s in rep.sessions for t in s.turns})
    for turn in turns:
        for k, s in enumerate(rep.sessions):
            row = next((t for t in s.turns if t.turn == turn and t.ttft_s is not None), None)
            lead = f"{turn:>4} " if k == 0 else "     "
            out.append(lead, style="bold")
            out.append(f"{s.id:<5}")
            if row is None:
                out.append("-\n", style="dim")
                continue
            out.append(
                "█" * max(1, round((row.ttft_s or 0) / top * BAR_WIDTH)), style="yellow" if k % 2 == 0 else "cyan"
            )
            out.append(f" {row.ttft_s:.2f}s\n")
    if rep.one_shot is not None and rep.one_shot.turn.ttft_s is not None:
        out.append(f"{'1shot':>10}", style="bold")
        out.append("█" * max(1, round(rep.one_shot.turn.ttft_s / top * BAR_WIDTH)), style="magenta")
        out.append(f" {rep.one_shot.turn.ttft_s:.2f}s (one-shot baseline)\n")
    return out


class ReportScreen(Screen[None]):
    """The per-turn tables of the run so far (a snapshot: press r again to refresh)."""

    BINDINGS = [Binding("escape,r,q", "app.pop_screen", "close")]

    def __init__(self, report: Report):
        super().__init__()
        self.report = report
        self.tables: dict[str, list[TurnRow]] = {s.id: list(s.turns) for s in report.sessions}
        if report.one_shot is not None:
            self.tables["one-shot"] = [report.one_shot.turn]
        self.sorted_by: dict[str, tuple[str, bool]] = {}

    def compose(self) -> ComposeResult:
        r = self.report.run
        with VerticalScroll(id="report-box"):
            yield Static(Text(report_title(r), style="bold"))
            for sid in self.tables:
                yield Static(
                    Text(f"session {sid}" if sid != "one-shot" else "one-shot baseline", style="bold"),
                    classes="report-title",
                )
                yield DataTable(id=f"turns-{sid}", classes="report-table", zebra_stripes=True, cursor_type="row")
            yield Static(Text("\n".join(summary_lines(self.report))), id="report-summary")
            yield Static(Text("TTFT per turn", style="bold"), classes="report-title")
            yield Static(ttft_bars(self.report), id="report-bars")
        yield Footer()

    def on_mount(self) -> None:
        self.columns = fitted_columns(list(self.tables.values()), self.app.size.width - 4)
        for sid in self.tables:
            self._fill(sid)

    def _fill(self, sid: str) -> None:
        table = self.query_one(f"#turns-{sid}", DataTable)
        table.clear(columns=True)
        table.add_columns(*self.columns)
        rows = self.tables[sid]
        if sid in self.sorted_by:
            name, reverse = self.sorted_by[sid]
            column = BY_HEAD[name]
            present = [r for r in rows if column.sort_value(r) is not None]
            rows = sorted(present, key=column.sort_value, reverse=reverse) + [r for r in rows if r not in present]
        for r in rows:
            table.add_row(*row_cells(r, self.columns))

    def sort(self, sid: str, column: str) -> None:
        """Sort one session's table by a column; the same column again reverses it."""
        name, reverse = self.sorted_by.get(sid, ("", False))
        self.sorted_by[sid] = (column, not reverse if name == column else False)
        self._fill(sid)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        sid = (event.data_table.id or "").removeprefix("turns-")
        self.sort(sid, str(event.label))
