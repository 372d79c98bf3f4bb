"""What every picture rampwatch draws shares: self-contained SVG and HTML (no script, no CDN: a file that opens
anywhere), escaping, the palette, round axis ticks and a line chart."""

from __future__ import annotations

import html
import math

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
pre { font-size: 0.85em; background: #f7f7f7; padding: 0.6em; }
svg text { font-family: system-ui, sans-serif; font-size: 11px; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


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


def tick_label(v: float) -> str:
    return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}K" if v >= 1e3 else f"{round(v, 6):g}"


def clock_text(t: float) -> str:
    m, s = divmod(int(t), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def line_chart(
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


def svg_height(svg: str) -> int:
    """The height an <svg> element above declares (its first attribute of that name)."""
    return int(svg.split('height="', 1)[1].split('"', 1)[0])


def html_page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{STYLE}</style></head><body>{body}</body></html>\n"
    )
