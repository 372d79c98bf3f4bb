"""Fewer bytes to the terminal: a partial screen update written from its first changed cell, not its widget's edge.

Textual writes a changed span of a line from the left edge of the widget that holds it to the span's end (its
ChopsUpdate crops the right side only). On the GPU node over SSH, a prefill timer ticking at the end of a
Sessions row then costs the whole row each time. `install()` wraps that one method so each chop is cropped on
both sides; where Textual no longer has the method or its fields (a future version), it changes nothing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.control import Control

_installed = False


def render_cropped(update: Any, console: Console) -> str:
    """ChopsUpdate.render_segments, each chop cropped to the spans' [x1, x2) on both sides."""
    sequences: list[str] = []
    chops, chop_ends = update.chops, update.chop_ends
    last_y = update.spans[-1][0]
    for y, x1, x2 in update.spans:
        for end, (x, strip) in zip(chop_ends[y], chops[y].items()):
            if strip is None or x > x2 or end <= x1:
                continue
            start = max(x, x1)
            strip = strip.crop(start - x, min(end, x2) - x)
            sequences.append(Control.move_to(start, y).segment.text)
            sequences.append(strip.render(console))
        if y != last_y:
            sequences.append("\n")
    return "".join(sequences)


def install() -> bool:
    """Crop Textual's partial updates on both sides; False (and nothing changed) where Textual differs."""
    global _installed
    try:
        from textual._compositor import ChopsUpdate
    except ImportError:
        return False
    if _installed:
        return True
    if not callable(getattr(ChopsUpdate, "render_segments", None)):
        return False
    original = ChopsUpdate.render_segments

    def render_segments(self: Any, console: Console) -> str:
        if not all(hasattr(self, name) for name in ("chops", "spans", "chop_ends")):
            return original(self, console)
        return render_cropped(self, console)

    ChopsUpdate.render_segments = render_segments  # type: ignore[method-assign]
    _installed = True
    return True
