"""What every panel of the main screen shares. A panel renders one part of a RunState it is
handed; none computes statistics (drivers/model/ does). A panel repaints only when what it would
show differs from what it shows, and then only the cells that changed; its height is set by the
app, so an update never relays out the screen."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group
from rich.text import Text
from textual.geometry import Region
from textual.widgets import Static

from rampwatch.drivers.model.state import RunState
from rampwatch.tui.widgets.dirty import Cell, cells, dirty_regions


def same_content(a: object, b: object) -> bool:
    """Whether two renderables of the panels (a Text or a Group of Texts) show the same."""
    if isinstance(a, Group) and isinstance(b, Group):
        return a.renderables == b.renderables
    return type(a) is type(b) and isinstance(a, Text) and a == b


class ChangingStatic(Static):
    """A Static that repaints only the cells whose content changed, without relayout: a figure
    ticking in one line costs its own cells on the terminal (an SSH link), not the panel's."""

    shown: object = None
    _lines: list[list[Cell]] | None = None  # what `shown` renders to, cell by cell, at _lines_width
    _lines_width = -1
    _changed: list[Region] | None = None  # what the next refresh() repaints; None: all

    def show_content(self, content: object) -> None:
        if self.shown is not None and same_content(content, self.shown):
            return
        width = self.size.width
        lines = self._render_lines(content, width) if width > 0 else None
        old = self._lines if self._lines_width == width else None
        self.shown, self._lines, self._lines_width = content, lines, width
        if lines is not None and old is not None and len(old) == len(lines):
            self._changed = dirty_regions(old, lines)
        try:
            self.update(content, layout=False)  # type: ignore[arg-type]
        finally:
            self._changed = None

    def _render_lines(self, content: object, width: int) -> list[list[Cell]]:
        console = self.app.console
        options = console.options.update_width(width)
        return [cells(line) for line in console.render_lines(content, options, pad=False)]  # type: ignore[arg-type]

    def refresh(self, *regions: Region, **kw: Any) -> ChangingStatic:
        """While show_content updates, only its changed cells are dirty; any other refresh is whole."""
        if self._changed is not None and not regions and not kw.get("layout") and not kw.get("recompose"):
            if not self._changed:
                return self
            regions = tuple(self._changed)
        return super().refresh(*regions, **kw)


class Panel(ChangingStatic):
    """A bordered panel that redraws from the state on the app's tick."""

    def __init__(self, title: str, **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.border_title = title
        self._last: tuple[RunState, float] | None = None

    def show(self, state: RunState, now: float) -> None:
        self._last = (state, now)
        self.show_content(self.render_state(state, now))

    def on_resize(self) -> None:
        """A panel sized by what is left (1fr) learns its height only after the tick that set the
        others': what it shows depends on its size, so it draws again."""
        if self._last is not None:
            self.show(*self._last)

    def plain_text(self) -> str:
        """What the panel shows, as plain text (for tests and captures)."""
        console = Console(width=max(20, self.size.width), file=io.StringIO())
        console.print(self.shown or "")
        return console.file.getvalue()  # type: ignore[attr-defined]

    def render_state(self, state: RunState, now: float) -> object:
        raise NotImplementedError

    @property
    def compact(self) -> bool:
        """Small terminals (80x24) get the short form of each panel."""
        return self.screen.has_class("-compact")
