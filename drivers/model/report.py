"""Turns a Report into text: a human table, markdown, CSV or the pinned JSON."""

from __future__ import annotations

import csv
import io

import msgspec
from rich.console import Console
from rich.table import Table

from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.turns import TurnRow
from rampwatch.drivers.client.ramp import format_tokens

FORMATS = ("table", "md", "csv", "json")
COLUMNS = ("turn", "context", "new", "cached", "TTFT s", "prefill tok/s", "decode tok/s", "out", "hit", "KV peak", "needle", "error")


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _needle(x: bool | None) -> str:
    return "-" if x is None else ("✓" if x else "✗")


def row_cells(r: TurnRow) -> list[str]:
    return [
        str(r.turn), format_tokens(r.context_tokens), format_tokens(r.new_tokens), format_tokens(r.cached_tokens),
        _num(r.ttft_s, ".2f"), _num(r.prefill_tok_s, ",.0f"), _num(r.decode_tok_s, ".1f"), str(r.output_tokens),
        _pct(r.hit_rate), _pct(r.kv_peak), _needle(r.needle), r.error or "",
    ]


def summary_lines(rep: Report) -> list[str]:
    lines = []
    for s in rep.sessions:
        m = s.summary
        lines.append(
            f"{s.id}: {m.turns} turns, TTFT sum {m.ttft_sum_s:.2f}s, longest {m.ttft_max_s:.2f}s, "
            f"decode median {_num(m.decode_tok_s_median, '.1f')} tok/s, needle {m.needle_found}/{m.turns}"
        )
    i = rep.interference
    if i.overlapping_turns:
        lines.append(
            f"interference: decode median {_num(i.decode_tok_s_alone_median, '.1f')} tok/s alone vs "
            f"{_num(i.decode_tok_s_during_foreign_prefill_median, '.1f')} tok/s while another session prefills "
            f"({i.overlapping_turns} overlapping turns)"
        )
    lines.append(f"server: KV peak {_pct(rep.server.kv_peak)}, hit rate last turn {_pct(rep.server.hit_rate_last_turn)}")
    return lines


def render(rep: Report, fmt: str, width: int = 140) -> str:
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(rep).decode(), indent=2)
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(["session", *TurnRow.__struct_fields__])
        for s in rep.sessions:
            for r in s.turns:
                w.writerow([s.id, *("" if v is None else v for v in msgspec.structs.astuple(r))])
        return out.getvalue()
    r = rep.run
    title = f"rampwatch report: {r.model} on {r.engine} at {r.server}, started {r.started_at}"
    if fmt == "md":
        parts = [f"## {title}", ""]
        for s in rep.sessions:
            parts += [f"### session {s.id}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
            parts += ["| " + " | ".join(row_cells(t)) + " |" for t in s.turns]
            parts.append("")
        parts += [f"- {line}" for line in summary_lines(rep)]
        return "\n".join(parts) + "\n"
    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    console.print(title)
    for s in rep.sessions:
        t = Table(title=f"session {s.id}", title_justify="left")
        for c in COLUMNS:
            t.add_column(c, justify="left" if c in ("needle", "error") else "right")
        for row in s.turns:
            t.add_row(*row_cells(row))
        console.print(t)
    for line in summary_lines(rep):
        console.print(line)
    return console.file.getvalue()  # type: ignore[attr-defined]
