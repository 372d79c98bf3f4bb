"""Pictures of runs (`rampwatch export`, `rampwatch compare --html`): a run's timeline with its TTFT against
context beneath, as one SVG or a self-contained HTML page with its summary; several runs' TTFT per turn."""

from __future__ import annotations

from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.modelled import speed_up
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turn_row import turn_row
from rampwatch.drivers.present.compare import Comparison
from rampwatch.drivers.present.svg import esc, html_page, line_chart, svg_height
from rampwatch.drivers.present.timeline_picture import timeline_svg


def ttft_chart_svg(state: RunState) -> str:
    """TTFT against context per ramp session; the one-shot baseline as a dashed line."""
    lines, baseline = [], None
    by_session = state.turns_by_session()
    for s in state.sessions.values():
        rows = [turn_row(r) for r in by_session.get(s.id, []) if r.status == "ok" and r.ttft is not None]
        if s.role == "one-shot":
            if rows:
                baseline = ("one-shot", rows[0].ttft_s or 0.0)
            continue
        lines.append((s.id, [(float(r.context_tokens), r.ttft_s or 0.0) for r in rows]))
    return line_chart(lines, "context (tokens)", "TTFT (s)", baseline=baseline, css="chart ttft")


def run_svg(state: RunState) -> str:
    """The timeline with the TTFT chart beneath, as one SVG."""
    top, chart = timeline_svg(state), ttft_chart_svg(state)
    h1, h2 = svg_height(top), svg_height(chart)
    width = 1400
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{h1 + h2 + 20}" viewBox="0 0 {width} {h1 + h2 + 20}">'
        f'<rect width="100%" height="100%" fill="white"/>{top}<g transform="translate(0,{h1 + 20})">{chart}</g></svg>'
    )


def run_html(state: RunState, summary: list[str]) -> str:
    h = state.header
    title = f"rampwatch: {h.model if h else '?'} on {h.engine if h else '?'}"
    info = (
        (
            f"{esc(h.server)} · started {esc(h.started_at)} · {counted(h.sessions, 'session')}"
            f"{' · lockstep' if h.lockstep else ''} · rampwatch {esc(h.rampwatch_version)}"
            + (f" · {speed_up(state.time_scale)}" if state.time_scale != 1.0 else "")
        )
        if h
        else ""
    )
    body = (
        f"<h1>{esc(title)}</h1><p>{info}</p><h2>Timeline</h2>{timeline_svg(state)}"
        f"<h2>TTFT against context</h2>{ttft_chart_svg(state)}<h2>Summary</h2>"
        f"<pre>{esc(chr(10).join(summary))}</pre>"
    )
    return html_page(title, body)


def compare_html(cmp: Comparison, table_fields: list[tuple[str, list[str]]]) -> str:
    """The comparison table and every run's TTFT per turn on one chart."""
    heads = "".join(f"<th>{esc(name)}</th>" for name, _ in table_fields)
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(cells[k])}</td>" for _, cells in table_fields) + "</tr>"
        for k in range(len(cmp.runs))
    )
    lines = [
        (run.label, [(float(c.turn), c.ttft_s[k]) for c in cmp.turns if c.ttft_s[k] is not None])
        for k, run in enumerate(cmp.runs)
    ]
    notes = "".join(f"<p>note: {esc(n)}</p>" for n in cmp.notes)
    body = (
        f'<h1>rampwatch: {len(cmp.runs)} runs compared</h1><table class="runs"><tr>{heads}</tr>{rows}</table>{notes}'
        f"<h2>TTFT per turn (slowest session)</h2>{line_chart(lines, 'turn (number)', 'TTFT (s)', css='chart turns')}"
    )
    return html_page("rampwatch comparison", body)
