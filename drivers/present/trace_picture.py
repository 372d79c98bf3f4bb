"""`rampwatch trace info --svg/--html`: a trace drawn small, over its time: requests per minute as bars, and the
live context (the KV its live sessions hold, as the peak live figure counts it) as a line beneath, with the KV
pool asked for (--kv-tokens) and the peak marked. Both from drivers/model/trace_stats.py, drawn, never computed."""

from __future__ import annotations

from collections.abc import Callable

from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.trace_stats import TraceCurves, TraceInfo
from rampwatch.drivers.present.format import pct
from rampwatch.drivers.present.svg import PALETTE, clock_text, clock_ticks, esc, html_page, nice_ticks, tick_label
from rampwatch.drivers.present.trace_info import render_trace_info

WIDTH = 900
LEFT, RIGHT = 70, 24  # the plot's margins: the strips' scales on the left
RATE_H, LIVE_H, GAP = 110, 130, 34
FONT = "text { font-family: system-ui, sans-serif; font-size: 11px; } .title { font-size: 14px; font-weight: 600; }"
RATE, LIVE, POOL, PEAK = PALETTE[0], PALETTE[2], "#555", PALETTE[3]


def trace_title(info: TraceInfo) -> str:
    return f"rampwatch: trace {info.path}"


def trace_caption(info: TraceInfo) -> str:
    """One line of what the trace is, under the title."""
    return (
        f"{info.format}, {info.block_size}-token blocks · {counted(info.sessions, 'session')}, "
        f"{counted(info.requests, 'request')} · "
        f"ideal hit {pct(info.ideal_hit_rate)} · peak live {info.peak_live_tokens:,} tokens"
    )


def trace_svg(info: TraceInfo, curves: TraceCurves) -> str:
    """The two strips over the trace's time, its title and caption above."""
    bins = len(curves.requests_per_minute)
    end = bins * curves.bin_s
    plot_w = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + t / end * plot_w

    parts = [
        f'<text class="title" x="4" y="18">{esc(trace_title(info))}</text>',
        f'<text x="4" y="36" fill="#555">{esc(trace_caption(info))}</text>',
    ]
    top = 54
    frame, rate_top = _strip_frame(top, RATE_H, "requests per minute", curves.requests_per_minute)
    parts.append(frame)
    bar_w = max(0.5, plot_w / bins - 1)
    for b, rate in enumerate(curves.requests_per_minute):
        if rate:
            h = rate / rate_top * RATE_H
            parts.append(
                f'<rect class="rate" x="{x(b * curves.bin_s):.1f}" y="{top + RATE_H - h:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}" fill="{RATE}"><title>{clock_text(b * curves.bin_s)}: {rate:,.1f} requests a '
                f"minute</title></rect>"
            )
    top += RATE_H + GAP
    pool = [float(info.kv_tokens)] if info.kv_tokens else []
    live_values = [float(v) for v in curves.live_tokens if v is not None] + pool
    frame, live_top = _strip_frame(top, LIVE_H, "live context (tokens)", live_values)
    parts.append(frame)

    def y(v: float) -> float:
        return top + LIVE_H - v / live_top * LIVE_H

    parts.append(f'<path class="live" d="{_steps(curves, x, y)}" fill="none" stroke="{LIVE}" stroke-width="1.6"/>')
    if info.kv_tokens:
        parts.append(
            f'<g class="pool"><line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(info.kv_tokens):.1f}" '
            f'y2="{y(info.kv_tokens):.1f}" stroke="{POOL}" stroke-dasharray="5,4"/><text x="{LEFT + plot_w - 4}" '
            f'y="{y(info.kv_tokens) - 4:.1f}" text-anchor="end" fill="{POOL}">KV pool {info.kv_tokens:,}</text></g>'
        )
    if info.peak_live_at_s is not None:
        px, py = x(info.peak_live_at_s), y(info.peak_live_tokens)
        parts.append(
            f'<g class="peak"><circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{PEAK}"/><text x="{px + 5:.1f}" '
            f'y="{py - 6:.1f}" fill="{PEAK}">peak {info.peak_live_tokens:,} in {info.peak_live_sessions:,} '
            f"sessions</text></g>"
        )
    top += LIVE_H + 6
    parts += [
        f'<text class="tick x" x="{x(t):.1f}" y="{top + 12}" text-anchor="middle" fill="#555">{clock_text(t)}</text>'
        for t in clock_ticks(end)
    ]
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{top + 28}" text-anchor="middle" fill="#333">trace time (h:mm:ss); '
        f"a bar is {curves.bin_s:g} s</text>"
    )
    height = top + 36
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="trace" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}"><style>{FONT}</style><rect width="100%" height="100%" fill="white"/>'
        f"{''.join(parts)}</svg>"
    )


def _steps(curves: TraceCurves, x: Callable[[float], float], y: Callable[[float], float]) -> str:
    """The live context as steps: each bin's most across it, held through the bins where nothing is due."""
    d: list[str] = []
    for b, v in enumerate(curves.live_tokens):
        if v is None:
            continue
        start, end = x(b * curves.bin_s), x((b + 1) * curves.bin_s)
        d.append(f"M{start:.1f},{y(v):.1f}" if not d else f"H{start:.1f}V{y(v):.1f}")
        d.append(f"H{end:.1f}")
    return "".join(d)


def _strip_frame(top: float, height: int, title: str, values: list[float]) -> tuple[str, float]:
    """A strip's box, its title above it and its round scale on the left; the markup and the scale's top."""
    ticks, end = nice_ticks(max(values, default=1.0) or 1.0, 3)
    labels = "".join(
        f'<text class="tick y" x="{LEFT - 4}" y="{top + height - v / end * height + 4:.1f}" text-anchor="end" '
        f'fill="#555">{tick_label(v)}</text>'
        for v in ticks
    )
    frame = (
        f'<g class="strip"><text x="{LEFT}" y="{top - 5}" fill="#333">{esc(title)}</text>'
        f'<rect x="{LEFT}" y="{top}" width="{WIDTH - LEFT - RIGHT}" height="{height}" fill="#fafafa" stroke="#ddd"/>'
        f"{labels}</g>"
    )
    return frame, end


def trace_html(info: TraceInfo, curves: TraceCurves) -> str:
    """The picture and `trace info`'s text on one page."""
    title = trace_title(info)
    body = (
        f"<h1>{esc(title)}</h1><p>{esc(trace_caption(info))}</p>{trace_svg(info, curves)}"
        f"<h2>Figures</h2><pre>{esc(render_trace_info(info))}</pre>"
    )
    return html_page(title, body)
