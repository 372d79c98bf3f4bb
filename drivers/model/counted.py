"""A count and its noun as a sentence says them: "1 turn", "1,024 turns"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` (thousands grouped) and `noun`, plural unless `n` is 1; `plural` for a noun that does not take an s."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
