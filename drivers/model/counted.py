"""A count and its noun as a sentence says them: "1 turn", "1,024 turns"."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """`n` (thousands grouped) and `noun`, with an s unless `n` is 1."""
    return f"{n:,} {noun if n == 1 else noun + 's'}"
