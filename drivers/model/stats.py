"""The one median and quantile every figure uses, so no two tables can round a middle value differently."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(xs: Sequence[float]) -> float | None:
    """The middle value (the mean of the two middle ones for an even count); None for no values."""
    return statistics.median(xs) if xs else None


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of an already sorted, non-empty sequence."""
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
