"""Small text helpers shared by the panels: durations, bars, sparklines."""

from __future__ import annotations

from rich.text import Text

from rampwatch.drivers.present.format import format_tokens, pct

SPARK = " ▁▂▃▄▅▆▇█"

__all__ = ["SPARK", "bar", "clock", "duration", "format_tokens", "pct", "rate", "sparkline", "whole"]


def duration(s: float | None) -> str:
    """1m12s, 45.2s, 0.31s, 1h03m."""
    if s is None:
        return "-"
    if s < 10:
        return f"{s:.2f}s"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def clock(s: float) -> str:
    m, sec = divmod(int(max(0.0, s)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}"


def whole(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def bar(fraction: float | None, width: int, style: str = "green") -> Text:
    """A horizontal gauge; an unknown fraction draws an empty frame."""
    width = max(1, width)
    if fraction is None:
        return Text("·" * width, style="dim")
    f = min(1.0, max(0.0, fraction))
    full = int(f * width)
    partial = " ▏▎▍▌▋▊▉"[int((f * width - full) * 8)] if full < width else ""
    t = Text("█" * full + partial, style=style)
    t.append("░" * (width - full - len(partial)), style="dim")
    return t


def sparkline(
    values: list[float],
    top: float,
    marks: list[bool] | None = None,
    rows: int = 1,
    style: str = "cyan",
    mark_style: str = "on #5f0000",
    fills: list[tuple[str, str] | None] | None = None,
) -> list[Text]:
    """A bar chart `rows` lines tall, one column per value, scaled to `top`;
    columns flagged in `marks` get `mark_style` as background; an empty column
    with a (glyph, style) in `fills` shows that glyph in its bottom line."""
    levels = [0 if top <= 0 or v <= 0 else max(1, min(rows * 8, int(round(v / top * rows * 8)))) for v in values]
    spans = _runs(marks) if marks else []
    filled = [(i, f) for i, f in enumerate(fills or ()) if f is not None and i < len(levels) and levels[i] == 0]
    lines = []
    for r in range(rows - 1, -1, -1):  # top line first
        base = r * 8
        chars = [SPARK[min(8, max(0, lv - base))] for lv in levels]
        for i, (glyph, _) in filled if r == 0 else ():
            chars[i] = glyph
        t = Text("".join(chars), style=style)
        for i, (_, fill_style) in filled if r == 0 else ():
            t.stylize(fill_style, i, i + 1)
        for a, b in spans:
            t.stylize(mark_style, a, b)
        lines.append(t)
    return lines


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each run of True: one style span per run, not per cell."""
    out, start = [], None
    for i, f in enumerate(flags):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(flags)))
    return out
