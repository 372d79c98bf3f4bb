"""The timeline of a run as SVG: one lane per session with its queued, prefill and decode spans (decode
coloured by its rate; where the engine timed a turn, its wait split into the client's side, the server's front
end, queued in the engine and the engine's prefill), turn boundaries, needle marks and failed turns, with the
other sessions' prefills shaded behind; beneath it, KV occupancy, prefix hit rate, running/waiting requests and
GPU load over time, as the fold kept them."""

from __future__ import annotations

from rampwatch.drivers.model.affinity import session_affinity
from rampwatch.drivers.model.history import MOST
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.ttft_split import WaitPart, wait_parts
from rampwatch.drivers.model.turn_row import turn_row
from rampwatch.drivers.model.turns import TurnRecord
from rampwatch.drivers.present.svg import clock_text, clock_ticks, esc, nice_ticks

LABEL_W, LANE_H, LANE_GAP, STRIP_H = 118, 16, 4, 56
PREFILL = "#f2b134"
HATCH_ID = "rw-queued-hatch"
# A turn the engine timed: its wait in parts told apart by fill, not by hue alone (neutral, hatched, solid); where
# the engine's span gave its own TTFT, the server's front end (teal) apart from the client's side (neutral).
WAIT_FILLS: dict[WaitPart, str] = {
    "rest": "#b0bec5",
    "client": "#b0bec5",
    "front end": "#4db6ac",
    "queued": f"url(#{HATCH_ID})",
    "prefill": PREFILL,
}
WAIT_TITLES: dict[WaitPart, str] = {
    "rest": "client, network and the server's front end",
    "client": "client, network, HTTP",
    "front end": "server front end: template, tokenizer",
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
FRONT_END_KEY = (WAIT_FILLS["front end"], 1.0, "then server front end")  # after the first key, where drawn
LEGEND = (
    (PREFILL, 1.0, "prefill"),
    ("hsl(0,65%,42%)", 1.0, "decode, slow"),
    ("hsl(120,65%,42%)", 1.0, "decode, fast"),
    ("#e53935", 0.4, "another session prefilling"),
    ("#c62828", 1.0, "failed turn"),
)


def legend_svg(y: int = 12, split: bool = False, front_end: bool = False) -> str:
    """One swatch and its own label per key, spaced apart, then the needle marks; `split`: the run has turns
    the engine timed, whose wait is drawn in parts (the keys for those parts replace the plain prefill's);
    `front_end`: some of them split off the server's front end."""
    parts, x = [], 4
    wait_keys = (SPLIT_KEYS[0], FRONT_END_KEY, *SPLIT_KEYS[1:]) if front_end else SPLIT_KEYS
    keys = (*wait_keys, *LEGEND[1:]) if split else LEGEND
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


def timeline_svg(state: RunState, width: int = 1400) -> str:
    """One lane per session, then the server's lines beneath (the fold's own history: no second fold)."""
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
    top = max((r for r in (rec.decode_rate for rec in state.turns) if r is not None), default=0.0)
    parts, split, front_end = [], False, False
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
        stay = session_affinity(recs)
        moved_turns = {m.turn for m in stay.moves} if stay is not None else set()  # the report's moves, drawn
        for r in recs:
            row = turn_row(r)
            tip = (
                f"{label} turn {r.turn}: {r.status}, TTFT {row.ttft_s or 0:.2f}s, decode "
                f"{row.decode_tok_s or 0:.1f} tok/s, context {row.context_tokens:,}"
            ) + (f", served by {r.served_by}" if r.served_by else "")
            parts.append(
                f'<line class="turn" x1="{x(r.sent_t):.1f}" x2="{x(r.sent_t):.1f}" y1="{y - 2}" y2="{y + LANE_H + 2}" '
                f'stroke="#455a64" stroke-width="0.6"/>'
            )
            stop = r.first_t if r.first_t is not None else (r.done_t or end)
            failed = r.status in ("failed", "cancelled")
            waits = None if failed else wait_parts(r)
            if waits:
                split = True
                front_end = front_end or any(part == "front end" for part, _, _ in waits)
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
            if r.served_by is not None and r.status == "ok":  # behind a router: each turn marked by its backend
                moved = r.turn in moved_turns
                parts.append(
                    f'<text class="backend{" moved" if moved else ""}" x="{x(r.sent_t) + 2:.1f}" y="{y + LANE_H - 2}" '
                    f'font-size="9" fill="{"#e65100" if moved else "#37474f"}">{esc(r.served_by)}</text>'
                )
            if (r.needle is not None or r.no_answer) and r.done_t is not None:
                mark, colour = ("∅", "#b26a00") if r.no_answer else ("✓", "#2e7d32") if r.needle else ("✗", "#c62828")
                parts.append(f'<text class="needle" x="{x(r.done_t):.1f}" y="{y - 1}" fill="{colour}">{mark}</text>')
        parts.append("</g>")
        y += LANE_H + LANE_GAP
    hist = state.server.history
    for title, line, top_value, unit in (
        ("KV cache", hist.kv.points, 1.0, "%"),
        ("prefix hit rate", hist.hit.points, 1.0, "%"),
        ("running / waiting", hist.running.points, None, "requests"),
        ("GPU load", hist.gpu.points, 100.0, "%"),
    ):
        y += 12
        parts.append(f'<g class="strip"><text x="4" y="{y + 12}">{esc(title)}</text>')
        parts.append(f'<rect x="{LABEL_W}" y="{y}" width="{plot_w}" height="{STRIP_H}" fill="#fafafa" stroke="#ddd"/>')
        lines = [(line, "#1f77b4")] + ([(hist.waiting.points, "#d62728")] if line is hist.running.points else [])
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
            f'<text class="tick" x="{x(t):.1f}" y="{y + 12}" text-anchor="middle" fill="#555">{clock_text(t)}</text>'
        )
    parts.append(
        f'<text x="{LABEL_W + plot_w / 2}" y="{y + 28}" text-anchor="middle" fill="#333">run time (h:mm:ss)</text>'
    )
    height = y + 36
    legend = (HATCH_DEFS + legend_svg(split=True, front_end=front_end)) if split else legend_svg()
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{legend}{"".join(parts)}</svg>'
    )


def _wait_rect(part: WaitPart, x0: float, x1: float, y: int, tip: str) -> str:
    """One part of a timed turn's wait; the client's side (the rest, where unsplit) is drawn thinner, as the
    lane's idle queue is."""
    top, height = (y + 3, LANE_H - 6) if part in ("rest", "client") else (y, LANE_H)
    return (
        f'<rect class="wait-{part.replace(" ", "-")}" x="{x0:.1f}" y="{top}" width="{max(0.5, x1 - x0):.1f}" '
        f'height="{height}" fill="{WAIT_FILLS[part]}"><title>{esc(tip)}</title></rect>'
    )


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _rate_colour(rate: float | None, top: float) -> str:
    """Decode spans from red (slow) to green (the run's fastest)."""
    if rate is None or top <= 0:
        return "#9e9e9e"
    return f"hsl({120 * min(1.0, rate / top):.0f},65%,42%)"


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    step = max(1, -(-len(points) // MOST))  # ceiling: at most MOST
    return points[::step]
