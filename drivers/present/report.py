"""Turns a Report into text: a human table, markdown, CSV or the pinned JSON."""

from __future__ import annotations

import csv
import io

import msgspec
from rich.console import Console
from rich.table import Table

from rampwatch.drivers.model.analysis import Report, RunInfo
from rampwatch.drivers.model.modelled import speed_up
from rampwatch.drivers.model.turn_row import TurnRow
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.drivers.present.turn_table import BY_HEAD, extra_width, row_cells, shown_columns

FORMATS = ("table", "md", "csv", "json")


def report_title(r: RunInfo) -> str:
    """The report's first line; a sped-up demo's says its times are modelled."""
    title = f"rampwatch report: {r.model} on {r.engine} at {r.server}, started {r.started_at}"
    if r.time_scale and r.time_scale != 1.0:
        title += f" ({speed_up(r.time_scale)})"
    return title


def _turn_tables(rep: Report) -> list[tuple[str, str, list[TurnRow]]]:
    """(session, title, rows) per ramp session, then the one-shot baseline."""
    tables = [(s.id, f"session {s.id}", s.turns) for s in rep.sessions]
    if rep.one_shot is not None:
        tables.append(("one-shot", "one-shot baseline", [rep.one_shot.turn]))
    return tables


def render(rep: Report, fmt: str, width: int = 140) -> str:
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(rep).decode(), indent=2)
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(["session", *TurnRow.__struct_fields__])
        for session, _, rows in _turn_tables(rep):
            for r in rows:
                w.writerow([session, *("" if v is None else v for v in msgspec.structs.astuple(r))])
        return out.getvalue()
    r = rep.run
    title = report_title(r)
    heads = shown_columns([t for _, _, rows in _turn_tables(rep) for t in rows])
    if fmt == "md":
        parts = [f"## {title}", ""]
        for _, title, rows in _turn_tables(rep):
            parts += [f"### {title}", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
            parts += ["| " + " | ".join(row_cells(t, heads)) + " |" for t in rows]
            parts.append("")
        parts += [f"- {line}" for line in summary_lines(rep)]
        return "\n".join(parts) + "\n"
    # The optional columns (reasoning, the engine's timing, speculation) come on top of the width laid out for.
    width += extra_width(heads)
    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    console.print(title)
    for _, title, rows in _turn_tables(rep):
        t = Table(title=title, title_justify="left")
        for c in heads:
            t.add_column(c, justify=BY_HEAD[c].align, no_wrap=c == "needle")  # 'no answer' on one line
        for row in rows:
            t.add_row(*row_cells(row, heads))
        console.print(t)
    for line in summary_lines(rep):
        console.print(line)
    return console.file.getvalue()  # type: ignore[attr-defined]
