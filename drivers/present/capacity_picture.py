"""An open-loop sweep's capacity curve as a picture (`rampwatch export SWEEP.sweep.json --svg/--html`): the
offered arrival rate across, achieved and goodput turns a minute on the left axis, p99 and p50 TTFT per 128K new
tokens on the right, each point marked kept, missed or saturated, and the knee a --find-max search found."""

from __future__ import annotations

from rampwatch.drivers.model.capacity import CapacityPoint, kept_share
from rampwatch.drivers.present.svg import PALETTE, esc, html_page, nice_ticks, tick_label

WIDTH, HEIGHT = 900, 440
LEFT, RIGHT, BOTTOM_PAD = 64, 84, 48  # the plot's margins: left axis labels; right axis labels; x labels
FONT = "text { font-family: system-ui, sans-serif; font-size: 11px; }"  # standalone too, as in the page
CHAR_W = 7  # at most ~7 px a character at 11 px (Chromium's sans), as the run picture's legend assumes
ACHIEVED, GOODPUT, LATENCY = PALETTE[0], PALETTE[2], PALETTE[3]
KEPT, MISSED, SATURATED = "#2e7d32", "#c62828", "#ef6c00"
# (series, colour, dash pattern, legend label): achieved and goodput on the left axis, the TTFTs on the right.
LINES = (
    ("achieved", ACHIEVED, "", "achieved turns/min"),
    ("goodput", GOODPUT, "", "goodput turns/min"),
    ("p99", LATENCY, "", "p99 TTFT s/128K"),
    ("p50", LATENCY, "4,3", "p50 TTFT s/128K"),
)


def verdict(p: CapacityPoint, slo_share: float | None) -> str:
    """What a point says: saturated (stopped early), else kept or missed the SLO share; '' without a search."""
    if p.status == "saturated":
        return "saturated"
    if slo_share is None:
        return ""
    return "kept" if kept_share(p, slo_share) else "missed"


def _legend(keys: list[tuple[str, str]], width: int) -> tuple[str, int]:
    """Keys (swatch markup, label) laid out left to right, wrapping to a new row; the markup and its height."""
    parts, x, y = [], 4, 14
    for swatch, label in keys:
        need = 22 + CHAR_W * len(label)
        if x > 4 and x + need > width:
            x, y = 4, y + 18
        parts.append(
            f'<g class="key"><g transform="translate({x},{y - 4})">{swatch}</g>'
            f'<text x="{x + 20}" y="{y}" fill="#555">{esc(label)}</text></g>'
        )
        x += need + 16
    return f'<g class="legend">{"".join(parts)}</g>', y + 10


def _line_swatch(colour: str, dash: str) -> str:
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<line x1="0" y1="0" x2="16" y2="0" stroke="{colour}" stroke-width="2"{dashes}/>'


def _mark_swatch(symbol: str, colour: str) -> str:
    return f'<text x="8" y="4" text-anchor="middle" fill="{colour}">{symbol}</text>'


# A point's verdict: (symbol, colour, legend label).
MARKS = {
    "kept": ("✓", KEPT, "kept the SLO share"),
    "missed": ("✗", MISSED, "missed it"),
    "saturated": ("⊘", SATURATED, "saturated (stopped early)"),
}


def capacity_svg(
    points: list[CapacityPoint],
    slo_share: float | None = None,
    knee: float | None = None,
    fail: float | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """The curve; `slo_share` (a --find-max search) marks each point kept or missed, `knee`/`fail` (per minute)
    draw where the knee lies."""
    pts = sorted(points, key=lambda p: p.offered_per_min)
    values = {
        "achieved": [(p.offered_per_min, p.turns_per_min) for p in pts],
        "goodput": [(p.offered_per_min, p.goodput_turns_per_min) for p in pts],
        "p99": [(p.offered_per_min, p.ttft_p99_per_128k_s) for p in pts],
        "p50": [(p.offered_per_min, p.ttft_p50_per_128k_s) for p in pts],
    }
    verdicts = [verdict(p, slo_share) for p in pts]
    slo = next((p.slo for p in pts if p.slo), None)
    keys = [
        (_line_swatch(c, d), f"{label} (SLO {slo})" if name == "goodput" and slo else label)
        for name, c, d, label in LINES
        if any(v is not None for _, v in values[name])
    ]
    keys += [(_mark_swatch(symbol, c), label) for v, (symbol, c, label) in MARKS.items() if v in verdicts]
    if knee is not None:
        keys.append((_line_swatch("#333", "6,4"), "knee" + (" (shaded: where it lies)" if fail else "")))
    legend, top = _legend(keys, width)
    top += 14
    bottom = height - BOTTOM_PAD
    right = width - RIGHT
    x_ticks, x_top = nice_ticks(max((p.offered_per_min for p in pts), default=1.0) or 1.0)
    rates = [v for name in ("achieved", "goodput") for _, v in values[name] if v is not None]
    l_ticks, l_top = nice_ticks(max(rates, default=1.0) or 1.0)
    waits = [v for name in ("p99", "p50") for _, v in values[name] if v is not None]
    r_ticks, r_top = nice_ticks(max(waits, default=1.0) or 1.0)

    def px(v: float) -> float:
        return LEFT + v / x_top * (right - LEFT)

    def py_left(v: float) -> float:
        return bottom - v / l_top * (bottom - top)

    def py_right(v: float) -> float:
        return bottom - v / r_top * (bottom - top)

    mid = (bottom + top) / 2
    parts = [
        legend,
        f'<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#555"/>',
        f'<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{bottom}" stroke="#555"/>',
        f'<line x1="{right}" y1="{top}" x2="{right}" y2="{bottom}" stroke="#555"/>',
        f'<text class="axis x" x="{(LEFT + right) / 2}" y="{height - 8}" text-anchor="middle">'
        "offered rate (conversations/min)</text>",
        f'<text class="axis left" x="14" y="{mid}" transform="rotate(-90 14 {mid})" text-anchor="middle">'
        "turns/min (achieved, goodput)</text>",
        f'<text class="axis right" x="{width - 12}" y="{mid}" transform="rotate(90 {width - 12} {mid})" '
        'text-anchor="middle">TTFT per 128K new tokens (s)</text>',
    ]
    parts += [
        f'<text class="tick x" x="{px(v):.1f}" y="{bottom + 16}" text-anchor="middle" fill="#555">'
        f"{tick_label(v)}</text>"
        for v in x_ticks
    ]
    parts += [
        f'<text class="tick left" x="{LEFT - 5}" y="{py_left(v) + 4:.1f}" text-anchor="end" fill="#555">'
        f"{tick_label(v)}</text>"
        for v in l_ticks
    ]
    parts += [
        f'<text class="tick right" x="{right + 5}" y="{py_right(v) + 4:.1f}" fill="#555">{tick_label(v)}</text>'
        for v in r_ticks
    ]
    if knee is not None:
        if fail is not None:
            parts.append(
                f'<rect class="knee-band" x="{px(knee):.1f}" y="{top}" width="{px(fail) - px(knee):.1f}" '
                f'height="{bottom - top}" fill="#9e9e9e" fill-opacity="0.15"/>'
            )
        parts.append(
            f'<g class="knee" data-knee="{knee:g}"><line x1="{px(knee):.1f}" x2="{px(knee):.1f}" y1="{top}" '
            f'y2="{bottom}" stroke="#333" stroke-dasharray="6,4"/><text x="{px(knee) - 4:.1f}" y="{top + 12}" '
            f'text-anchor="end" fill="#333">knee {knee:.4g}/min</text></g>'
        )
    for name, colour, dash, label in LINES:
        scale = py_left if name in ("achieved", "goodput") else py_right
        line = [(x, y) for x, y in values[name] if y is not None]
        if not line:
            continue
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        path = " ".join(f"{px(x):.1f},{scale(y):.1f}" for x, y in line)
        dots = "".join(
            f'<circle cx="{px(x):.1f}" cy="{scale(y):.1f}" r="3" fill="{colour}">'
            f"<title>{esc(label)} at {x:.4g}/min: {y:.3g}</title></circle>"
            for x, y in line
        )
        parts.append(
            f'<g class="series" data-name="{name}"><polyline points="{path}" fill="none" stroke="{colour}" '
            f'stroke-width="1.8"{dashes}/>{dots}</g>'
        )
    for p, v in zip(pts, verdicts, strict=True):
        data = {
            "offered": p.offered_per_min,
            "achieved": p.turns_per_min,
            "goodput": p.goodput_turns_per_min,
            "p99": p.ttft_p99_per_128k_s,
            "p50": p.ttft_p50_per_128k_s,
        }
        attrs = " ".join(f'data-{k}="{"" if x is None else repr(float(x))}"' for k, x in data.items())
        mark = ""
        if v:
            symbol, colour, _ = MARKS[v]
            mark = (
                f'<text x="{px(p.offered_per_min):.1f}" y="{bottom - 6}" text-anchor="middle" fill="{colour}">'
                f"{symbol}<title>{p.offered_per_min:.4g}/min: {v}</title></text>"
            )
        parts.append(f'<g class="point" {attrs} data-verdict="{v}">{mark}</g>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="capacity" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><style>{FONT}</style><rect width="100%" height="100%" fill="white"/>'
        f"{''.join(parts)}</svg>"
    )


def capacity_html(title: str, info: str, svg: str, table: str) -> str:
    """The curve and the sweep's table (as `sweep` printed it) on one page."""
    body = f"<h1>{esc(title)}</h1><p>{esc(info)}</p>{svg}<h2>Points</h2><pre>{esc(table)}</pre>"
    return html_page(title, body)
