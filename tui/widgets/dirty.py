"""Which cells of a redrawn line changed: the UI repaints only those, so a figure ticking in one row costs its
own few cells on the terminal (an SSH link to the GPU node), not the row's or the panel's."""

from __future__ import annotations

from collections.abc import Iterable

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region

Cell = tuple[str, Style | None]


def cells(line: Iterable[Segment]) -> list[Cell]:
    """One (character, style) per terminal cell; a wide character's second cell is ("", style)."""
    out: list[Cell] = []
    for segment in line:
        if segment.control:
            continue
        for char in segment.text:
            out.append((char, segment.style))
            out.extend([("", segment.style)] * (cell_len(char) - 1))
    return out


def changed_span(old: list[Cell], new: list[Cell]) -> tuple[int, int] | None:
    """(first, end) of the cells that differ between two renderings of a line (end exclusive); None: the same.
    A line that got shorter differs up to its old end, so the cells it no longer covers are cleared."""
    if old == new:
        return None
    width = max(len(old), len(new))
    first = next(x for x in range(width) if x >= len(old) or x >= len(new) or old[x] != new[x])
    end = next(x for x in range(width - 1, -1, -1) if x >= len(old) or x >= len(new) or old[x] != new[x]) + 1
    # A wide character is written whole: a span never starts or ends inside one.
    while first > 0 and first < len(new) and new[first][0] == "":
        first -= 1
    while end < len(new) and new[end][0] == "":
        end += 1
    return first, end


def dirty_regions(old: list[list[Cell]], new: list[list[Cell]]) -> list[Region]:
    """One region a changed line: just its changed cells."""
    regions = []
    for y, (a, b) in enumerate(zip(old, new)):
        span = changed_span(a, b)
        if span is not None:
            regions.append(Region(span[0], y, span[1] - span[0], 1))
    return regions
