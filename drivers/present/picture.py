"""Pictures of runs as self-contained SVG and HTML: no script, no CDN, a file
that opens anywhere (`rampwatch export`, `rampwatch compare --html`).

The timeline has one lane per session: queued, prefill and decode spans
(decode coloured by its rate; where the engine timed a turn, its wait split
into the client's rest, queued in the engine and the engine's prefill), turn boundaries, needle marks and failed
turns, with the other sessions' prefills shaded behind; beneath it, KV
occupancy, prefix hit rate, running/waiting requests and GPU load over time.
The chart gives TTFT against context per session, with the one-shot
baseline as a line. Everything is folded from the recording's events. (Just over
~400 lines: the timeline, its legend and its timed waits' fills are one drawing.)
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.modelled import speed_up
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turns import TurnRecord, WaitPart, turn_row, wait_parts
from rampwatch.drivers.present.compare import Comparison

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MAX_POINTS = 1500  # per metric line: a 2-hour run scraped twice a second is thinned to this
LABEL_W, LANE_H, LANE_GAP, STRIP_H = 118, 16, 4, 56
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
pre { font-size: 0.85em; background: #f7f7f7; padding: 0.6em; }
svg text { font-family: system-ui, sans-serif; font-size: 11px; }
"""


@dataclass
class Series:
    """The run folded once: its final state and its metric lines over time."""

    state: RunState
    kv: list[tuple[float, float]] = field(default_factory=list)
    hit: list[tuple[float, float]] = field(default_factory=list)
    running: list[tuple[float, float]] = field(default_factory=list)
    waiting: list[tuple[float, float]] = field(default_factory=list)
    gpu: list[tuple[float, float]] = field(default_factory=list)  # mean utilisation, percent


def fold(header: ev.Header, events: list[ev.AnyEvent]) -> Series:
    out = Series(RunState(header))
    state = out.state
    for e in events:
        state.apply(e)
        if isinstance(e, ev.MetricsSample):
            v = state.server.values
            for line, value in (
                (out.kv, v.get("kv_usage")),
                (out.hit, state.hit_rate_since_start()),
                (out.running, v.get("running")),
                (out.waiting, v.get("waiting")),
            ):
                if value is not None:
                    line.append((e.t * state.time_scale, value))  # modelled, as the lanes' times are
        elif isinstance(e, ev.GpuSample):
            utils = [g.util for g in e.gpus if g.util is not None]
            if utils:
                out.gpu.append((e.t * state.time_scale, sum(utils) / len(utils)))
    return out


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    step = max(1, -(-len(points) // MAX_POINTS))  # ceiling: at most MAX_POINTS
    return points[::step]


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _rate_colour(rate: float | None, top: float) -> str:
    """Decode spans from red (slow) to green (the run's fastest)."""
    if rate is None or top <= 0:
        return "#9e9e9e"
    return f"hsl({120 * min(1.0, rate / top):.0f},65%,42%)"


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


NICE = (1.0, 2.0, 5.0)
CLOCK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def nice_step(top: float, ticks: int = 6) -> float:
    """The smallest 1-2-5 step that covers 0..top in at most `ticks` intervals."""
    if top <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(top / ticks))
    return next(
        m * magnitude * k for k in (1, 10) for m in NICE if math.ceil(top / (m * magnitude * k) - 1e-9) <= ticks
    )


def nice_ticks(top: float, ticks: int = 6) -> tuple[list[float], float]:
    """Round tick values from 0 covering `top`, and the axis end (the last tick, at or above top)."""
    step = nice_step(top, ticks)
    count = max(1, math.ceil(top / step - 1e-9))
    return [step * k for k in range(count + 1)], step * count


def clock_ticks(end: float, ticks: int = 6) -> list[float]:
    """Round run times (10 s, 1 min, 5 min, 1 h ...) from 0 up to `end`, at most `ticks` + 1 of them."""
    step = next(
        (s for s in CLOCK_STEPS_S if end / s <= ticks), CLOCK_STEPS_S[-1] * math.ceil(end / CLOCK_STEPS_S[-1] / ticks)
    )
    return [step * k for k in range(int(end // step) + 1)]


PREFILL = "#f2b134"
HATCH_ID = "rw-queued-hatch"
# A turn the engine timed: its wait in three parts told apart by fill, not by hue alone (neutral, hatched, solid).
WAIT_FILLS: dict[WaitPart, str] = {"rest": "#b0bec5", "queued": f"url(#{HATCH_ID})", "prefill": PREFILL}
WAIT_TITLES: dict[WaitPart, str] = {
    "rest": "client, HTTP, tokenizer",
    "queued": "queued in the engine",
    "prefill": "engine prefill",
}
HATCH_DEFS = (
    f'<defs><pattern id="{HATCH_ID}" width="4" height="4" patternUnits="userSpaceOnUse" '
    f'patternTransform="rotate(45)"><rect width="4" height="4" fill="#fdebc8"/>'
    f'<line x1="0" y1="0" x2="0" y2="4" stroke="{PREFILL}" stroke-width="1.6"/></pattern></defs>'
)
SPLIT_KEYS = (  # the legend's keys for a wait split, in the order they are drawn: one line that reads left to right
    (WAIT_FILLS["rest"], 1.0, "wait: client, HTTP"),
    (WAIT_FILLS["queued"], 1.0, "then queued"),
    (WAIT_FILLS["prefill"], 1.0, "then engine prefill"),
)
LEGEND = (
    (PREFILL, 1.0, "prefill"),
    ("hsl(0,65%,42%)", 1.0, "decode, slow"),
    ("hsl(120,65%,42%)", 1.0, "decode, fast"),
    ("#e53935", 0.4, "another session prefilling"),
    ("#c62828", 1.0, "failed turn"),
)


def legend_svg(y: int = 12, split: bool = False) -> str:
    """One swatch and its own label per key, spaced apart, then the needle marks; `split`: the run has turns
    the engine timed, whose wait is drawn in parts (the keys for those parts replace the plain prefill's)."""
    parts, x = [], 4
    keys = (*SPLIT_KEYS, *LEGEND[1:]) if split else LEGEND
    for colour, opacity, label in keys:
        parts.append(
            f'<g class="key"><rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}" '
            f'fill-opacity="{opacity}"/><text x="{x + 14}" y="{y}" fill="#555">{esc(label)}</text></g>'
        )
        x += 14 + 7 * len(label) + 18  # at most ~7 px a character at 11 px (Chromium's sans), then a gap
    parts.append(
        f'<g class="key"><text x="{x}" y="{y}" fill="#555"><tspan fill="#2e7d32">✓</tspan> / '
        f'<tspan fill="#c62828">✗</tspan> needle found / missed</text></g>'
    )
    return f'<g class="legend">{"".join(parts)}</g>'


def timeline_svg(series: Series, width: int = 1400) -> str:
    state = series.state
    end = max(state.t, 1e-9)
    plot_w = width - LABEL_W - 80  # room on the right for each strip's scale
    x = lambda t: LABEL_W + t / end * plot_w  # noqa: E731
    sessions = list(state.sessions.values())
    by_session: dict[str, list[TurnRecord]] = {}
    for r in state.turns:
        by_session.setdefault(r.session, []).append(r)
    prefill = {
        sid: [(r.sent_t, r.first_t if r.first_t is not None else (r.done_t or end)) for r in recs]
        for sid, recs in by_session.items()
    }
    rates = [turn_row(r).decode_tok_s for r in state.turns]
    top = max((r for r in rates if r is not None), default=0.0)
    parts, split = [], False
    y = 34  # below the legend and the needle marks above the first lane
    for s in sessions:
        recs = by_session.get(s.id, [])
        label = "one-shot" if s.role == "one-shot" else s.id
        parts.append(f'<g class="lane" data-session="{esc(s.id)}">')
        parts.append(f'<text x="4" y="{y + LANE_H - 4}" class="lane-label">{esc(label)}</text>')
        others = _union([span for sid, spans in prefill.items() if sid != s.id for span in spans])
        for a, b in others:
            parts.append(
                f'<rect class="foreign" x="{x(a):.1f}" y="{y - 2}" width="{max(0.5, x(b) - x(a)):.1f}" '
                f'height="{LANE_H + 4}" fill="#e53935" fill-opacity="0.13"/>'
            )
        first_sent = min((r.sent_t for r in recs), default=end)
        parts.append(
            f'<rect class="queued" x="{x(0):.1f}" y="{y + 5}" width="{max(0.0, x(first_sent) - x(0)):.1f}" '
            f'height="{LANE_H - 10}" fill="#cfd8dc"><title>queued</title></rect>'
        )
        for r in recs:
            row = turn_row(r)
            tip = (
                f"{label} turn {r.turn}: {r.status}, TTFT {row.ttft_s or 0:.2f}s, decode "
                f"{row.decode_tok_s or 0:.1f} tok/s, context {row.context_tokens:,}"
            )
            parts.append(
                f'<line class="turn" x1="{x(r.sent_t):.1f}" x2="{x(r.sent_t):.1f}" y1="{y - 2}" y2="{y + LANE_H + 2}" '
                f'stroke="#455a64" stroke-width="0.6"/>'
            )
            stop = r.first_t if r.first_t is not None else (r.done_t or end)
            failed = r.status in ("failed", "cancelled")
            waits = None if failed else wait_parts(r.sent_t, r.first_t, r.queued_s, r.server_prefill_s)
            if waits:
                split = True
                parts += [
                    _wait_rect(part, x(a), x(b), y, f"{tip}; {WAIT_TITLES[part]} {b - a:.2f}s") for part, a, b in waits
                ]
            else:
                wide = max(0.5, x(stop) - x(r.sent_t))
                parts.append(
                    f'<rect class="prefill" x="{x(r.sent_t):.1f}" y="{y}" width="{wide:.1f}" '
                    f'height="{LANE_H}" fill="{"#c62828" if failed else PREFILL}"><title>{esc(tip)}</title></rect>'
                )
            if r.first_t is not None and r.done_t is not None:
                parts.append(
                    f'<rect class="decode" x="{x(r.first_t):.1f}" y="{y}" '
                    f'width="{max(0.5, x(r.done_t) - x(r.first_t)):.1f}" '
                    f'height="{LANE_H}" fill="{"#c62828" if failed else _rate_colour(row.decode_tok_s, top)}">'
                    f"<title>{esc(tip)}</title></rect>"
                )
            if (r.needle is not None or r.no_answer) and r.done_t is not None:
                mark, colour = ("∅", "#b26a00") if r.no_answer else ("✓", "#2e7d32") if r.needle else ("✗", "#c62828")
                parts.append(f'<text class="needle" x="{x(r.done_t):.1f}" y="{y - 1}" fill="{colour}">{mark}</text>')
        parts.append("</g>")
        y += LANE_H + LANE_GAP
    for title, line, top_value, unit in (
        ("KV cache", series.kv, 1.0, "%"),
        ("prefix hit rate", series.hit, 1.0, "%"),
        ("running / waiting", series.running, None, "requests"),
        ("GPU load", series.gpu, 100.0, "%"),
    ):
        y += 12
        parts.append(f'<g class="strip"><text x="4" y="{y + 12}">{esc(title)}</text>')
        parts.append(f'<rect x="{LABEL_W}" y="{y}" width="{plot_w}" height="{STRIP_H}" fill="#fafafa" stroke="#ddd"/>')
        lines = [(line, "#1f77b4")] + ([(series.waiting, "#d62728")] if line is series.running else [])
        peak = top_value or nice_ticks(max((v for ln, _ in lines for _, v in ln), default=1.0) or 1.0)[1]
        if not line:
            parts.append(f'<text x="{LABEL_W + 6}" y="{y + STRIP_H / 2 + 4}" fill="#999">not recorded</text>')
        for ln, colour in lines:
            pts = " ".join(f"{x(t):.1f},{y + STRIP_H - v / peak * (STRIP_H - 4):.1f}" for t, v in _thin(ln))
            if pts:
                parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.2"/>')
        scale = "100%" if unit == "%" else f"{peak:g} {unit}"
        parts.append(f'<text x="{LABEL_W + plot_w + 3}" y="{y + 10}" fill="#777">{scale}</text></g>')
        y += STRIP_H
    y += 10
    for t in clock_ticks(end):  # the time axis, at round times
        parts.append(
            f'<text class="tick" x="{x(t):.1f}" y="{y + 12}" text-anchor="middle" fill="#555">{_clock(t)}</text>'
        )
    parts.append(
        f'<text x="{LABEL_W + plot_w / 2}" y="{y + 28}" text-anchor="middle" fill="#333">run time (h:mm:ss)</text>'
    )
    height = y + 36
    legend = (HATCH_DEFS + legend_svg(split=True)) if split else legend_svg()
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{legend}{"".join(parts)}</svg>'
    )


def _wait_rect(part: WaitPart, x0: float, x1: float, y: int, tip: str) -> str:
    """One part of a timed turn's wait; the rest (client, HTTP) is drawn thinner, as the lane's idle queue is."""
    top, height = (y + 3, LANE_H - 6) if part == "rest" else (y, LANE_H)
    return (
        f'<rect class="wait-{part}" x="{x0:.1f}" y="{top}" width="{max(0.5, x1 - x0):.1f}" height="{height}" '
        f'fill="{WAIT_FILLS[part]}"><title>{esc(tip)}</title></rect>'
    )


def _clock(t: float) -> str:
    m, s = divmod(int(t), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _chart(
    lines: list[tuple[str, list[tuple[float, float]]]],
    x_label: str,
    y_label: str,
    width: int = 900,
    height: int = 360,
    baseline: tuple[str, float] | None = None,
    css: str = "chart",
) -> str:
    """Lines of (x, y) points with axes, one colour per line, and an optional horizontal baseline."""
    xs = [px for _, pts in lines for px, _ in pts] or [1.0]
    ys = [py for _, pts in lines for _, py in pts] + ([baseline[1]] if baseline else []) or [1.0]
    x_ticks, x_top = nice_ticks(max(xs) or 1.0)
    y_ticks, y_top = nice_ticks(max(ys) or 1.0)
    left, bottom = 60, height - 40
    px = lambda v: left + v / x_top * (width - left - 150)  # noqa: E731
    py = lambda v: bottom - v / y_top * (bottom - 16)  # noqa: E731
    parts = [
        f'<line x1="{left}" y1="{bottom}" x2="{width - 150}" y2="{bottom}" stroke="#555"/>',
        f'<line x1="{left}" y1="16" x2="{left}" y2="{bottom}" stroke="#555"/>',
        f'<text x="{(left + width - 150) / 2}" y="{height - 6}" text-anchor="middle">{esc(x_label)}</text>',
        f'<text x="12" y="{(bottom + 16) / 2}" transform="rotate(-90 12 {(bottom + 16) / 2})" text-anchor="middle">'
        f"{esc(y_label)}</text>",
    ]
    for vx in x_ticks:
        parts.append(
            f'<text class="tick x" x="{px(vx):.1f}" y="{bottom + 14}" '
            f'text-anchor="middle" fill="#555">{tick_label(vx)}</text>'
        )
    for vy in y_ticks:
        parts.append(
            f'<text class="tick y" x="{left - 4}" y="{py(vy) + 4:.1f}" text-anchor="end" fill="#555">'
            f"{tick_label(vy)}</text>"
        )
    for k, (name, pts) in enumerate(lines):
        colour = PALETTE[k % len(PALETTE)]
        path = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        parts.append(
            f'<g class="series" data-name="{esc(name)}"><polyline points="{path}" fill="none" stroke="{colour}" '
            f'stroke-width="1.6"/>'
        )
        parts += [
            f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="2.6" '
            f'fill="{colour}"><title>{esc(name)}: {b:.2f}</title></circle>'
            for a, b in pts
        ]
        parts.append(f'<text x="{width - 140}" y="{24 + 16 * k}" fill="{colour}">{esc(name)}</text></g>')
    if baseline is not None:
        name, value = baseline
        parts.append(
            f'<g class="baseline"><line x1="{left}" x2="{width - 150}" y1="{py(value):.1f}" y2="{py(value):.1f}" '
            f'stroke="#333" stroke-dasharray="5,4"/><text x="{width - 140}" y="{py(value) + 4:.1f}">'
            f"{esc(name)} {value:.2f}s</text></g>"
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{css}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{"".join(parts)}</svg>'
    )


def tick_label(v: float) -> str:
    return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}K" if v >= 1e3 else f"{round(v, 6):g}"


def ttft_chart_svg(state: RunState) -> str:
    """TTFT against context per ramp session; the one-shot baseline as a dashed line."""
    lines, baseline = [], None
    for s in state.sessions.values():
        rows = [turn_row(r) for r in state.turns if r.session == s.id and r.status == "ok" and r.ttft is not None]
        if s.role == "one-shot":
            if rows:
                baseline = ("one-shot", rows[0].ttft_s or 0.0)
            continue
        lines.append((s.id, [(float(r.context_tokens), r.ttft_s or 0.0) for r in rows]))
    return _chart(lines, "context (tokens)", "TTFT (s)", baseline=baseline, css="chart ttft")


def run_svg(series: Series) -> str:
    """The timeline with the TTFT chart beneath, as one SVG."""
    top, chart = timeline_svg(series), ttft_chart_svg(series.state)
    h1, h2 = _height(top), _height(chart)
    width = 1400
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{h1 + h2 + 20}" viewBox="0 0 {width} {h1 + h2 + 20}">'
        f'<rect width="100%" height="100%" fill="white"/>{top}<g transform="translate(0,{h1 + 20})">{chart}</g></svg>'
    )


def _height(svg: str) -> int:
    """The height an <svg> element above declares (its first attribute of that name)."""
    return int(svg.split('height="', 1)[1].split('"', 1)[0])


def html_page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{STYLE}</style></head><body>{body}</body></html>\n"
    )


def run_html(series: Series, summary: list[str]) -> str:
    h = series.state.header
    title = f"rampwatch: {h.model if h else '?'} on {h.engine if h else '?'}"
    info = (
        (
            f"{esc(h.server)} · started {esc(h.started_at)} · {h.sessions} session(s)"
            f"{' · lockstep' if h.lockstep else ''} · rampwatch {esc(h.rampwatch_version)}"
            + (f" · {speed_up(series.state.time_scale)}" if series.state.time_scale != 1.0 else "")
        )
        if h
        else ""
    )
    body = (
        f"<h1>{esc(title)}</h1><p>{info}</p><h2>Timeline</h2>{timeline_svg(series)}"
        f"<h2>TTFT against context</h2>{ttft_chart_svg(series.state)}<h2>Summary</h2>"
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
        f"<h2>TTFT per turn (slowest session)</h2>{_chart(lines, 'turn (number)', 'TTFT (s)', css='chart turns')}"
    )
    return html_page("rampwatch comparison", body)
