"""What the UI sends to the terminal: only the lines that changed (issue 23: a GPU node watched over SSH).

The rates themselves are measured by tests/bench_terminal.py in a real terminal; these tests pin the
mechanisms: a panel repaints only its changed lines, the Sessions table only its changed rows, and the
decode chart moves a quarter page at a time instead of scrolling every second.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import Static

from rampwatch.tui.widgets.panels import ChangingStatic, chart_start


class Recorder(ChangingStatic):
    """Records the regions each repaint asked Textual for (None: the whole widget)."""

    def __init__(self, **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.asked: list[tuple[Region, ...] | None] = []


def record_repaints(monkeypatch) -> None:  # noqa: ANN001
    """What reaches Textual's own refresh, after ChangingStatic chose the lines."""
    base = Static.refresh

    def refresh(self, *regions, **kw):  # noqa: ANN001, ANN003, ANN202
        if isinstance(self, Recorder) and self.is_mounted:
            self.asked.append(tuple(regions) or None)
        return base(self, *regions, **kw)

    monkeypatch.setattr(Static, "refresh", refresh)


class OnePanel(App[None]):
    def compose(self) -> ComposeResult:
        yield Recorder(id="p")


def lines(*texts: str) -> Group:
    return Group(*(Text(t) for t in texts))


async def test_a_panel_repaints_only_the_lines_that_changed(monkeypatch):
    record_repaints(monkeypatch)
    app = OnePanel()
    async with app.run_test(size=(40, 10)) as pilot:
        panel = app.query_one(Recorder)
        panel.show_content(lines("kv 11%", "prefill 7.6s", "requests 2"))
        await pilot.pause()
        panel.asked.clear()
        panel.show_content(lines("kv 11%", "prefill 7.7s", "requests 2"))
        await pilot.pause()
        assert panel.asked and all(a is not None for a in panel.asked)
        repainted = {y for a in panel.asked if a for r in a for y in range(r.y, r.bottom)}
        assert repainted == {1}
        panel.asked.clear()
        panel.show_content(lines("kv 11%", "prefill 7.7s", "requests 2"))  # the same again: nothing
        await pilot.pause()
        assert panel.asked == []
        panel.show_content(lines("kv 12%", "prefill 7.8s"))  # fewer lines: the whole panel
        await pilot.pause()
        assert None in panel.asked


async def test_what_a_partial_repaint_shows_is_the_new_content():
    app = OnePanel()
    async with app.run_test(size=(40, 10)) as pilot:
        panel = app.query_one(Recorder)
        panel.show_content(lines("a 1", "b 1", "c 1"))
        await pilot.pause()
        panel.show_content(lines("a 1", "b 2", "c 1"))
        await pilot.pause()
        shown = [panel.render_line(y).text.rstrip() for y in range(3)]
        assert shown == ["a 1", "b 2", "c 1"]


def test_the_chart_fills_from_the_start_then_moves_a_quarter_page_at_a_time():
    width = 40
    assert [chart_start(last, width) for last in (0, 20, 39)] == [0, 0, 0]
    starts = [chart_start(last, width) for last in range(40, 120)]
    assert all(first <= last <= first + width - 1 for first, last in zip(starts, range(40, 120)))
    moves = sum(1 for a, b in zip(starts, starts[1:]) if a != b)
    assert moves == 80 // 10 - 1  # one move per 10 s (a quarter of 40 cells), not one per second
    assert set(starts) <= set(range(0, 200, 10))
