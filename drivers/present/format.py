"""Text for numbers, one definition each: the report, compare and the terminal UI all print through these."""

from __future__ import annotations


def format_tokens(n: int | float | None) -> str:
    """Compact count for tables: 1.0M, 131K, 950."""
    if n is None:
        return "-"
    if n >= 999_500:
        return f"{n / 1_000_000:.2f}M".replace(".00M", "M")
    if n >= 10_000:
        return f"{n / 1000:.0f}K"
    if n >= 1000:
        return f"{n / 1000:.1f}K"
    return f"{n:.0f}"


def fmt_num(x: float | None, fmt: str) -> str:
    """`x` in format `fmt`, or '-' when it is unknown."""
    return "-" if x is None else format(x, fmt)


def pct(x: float | None) -> str:
    """A fraction as a whole percentage (0.42 -> 42%), or '-' when it is unknown."""
    return "-" if x is None else f"{x * 100:.0f}%"


def needle_mark(x: bool | None, no_answer: bool = False) -> str:
    """✓ found, ✗ missed, 'no answer' (the reply was cut before it answered), - not asked."""
    if no_answer:
        return "no answer"
    return "-" if x is None else ("✓" if x else "✗")
