"""What the UI sends to the terminal: only the lines that changed (issue 23: a GPU node watched over SSH).

The rates themselves are measured by tests/bench_terminal.py in a real terminal; these tests pin the
mechanisms: a panel repaints only its changed lines, the Sessions table only its changed rows, and the
decode chart moves a quarter page at a time instead of scrolling every second.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import Static

from rampwatch.tui.widgets.base import ChangingStatic
from rampwatch.tui.widgets.timeline import chart_start


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


def test_a_partial_update_is_written_from_its_first_changed_cell():
    """Textual's ChopsUpdate, through the installed writer: only the span's cells, not from the widget's edge."""
    from rich.console import Console
    from rich.segment import Segment
    from textual._compositor import ChopsUpdate
    from textual.strip import Strip

    from rampwatch.tui import terminal_output

    assert terminal_output.install()
    line = Strip([Segment("│ "), Segment("s1 prefilling 7.6s"), Segment(" │")])
    update = ChopsUpdate([{0: line}], [(0, 16, 18)], [[line.cell_length]])
    written = update.render_segments(Console(color_system=None, force_terminal=True))
    assert written == "\x1b[1;17H7." and "s1" not in written


@pytest.mark.serial  # a real terminal drawn in real time: alone, so no other test slows its frames
async def test_the_screen_after_cropped_updates_is_what_the_app_drew(tmp_path):
    """In a real terminal (tmux): a replay drawn by many cropped updates, then sent to its end, shows exactly the
    screen the app's own compositor holds for that moment (no cell shifted, none stale)."""
    import asyncio
    import shutil
    import subprocess

    from rampwatch.drivers.run.recording import read_recording
    from rampwatch.tui.app import RampwatchApp
    from rampwatch.tui.sources import ReplaySource
    from tests.conftest import missing, rampwatch_cmd

    if shutil.which("tmux") is None:
        missing("TMUX", "no tmux on PATH (apt-get install tmux; .ci/run installs it)")
    recording = Path(__file__).resolve().parents[1] / "recordings" / "glm-like-2x1m.sample.jsonl"
    app = RampwatchApp(ReplaySource(read_recording(recording)), autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_seek_to(-1)
        await pilot.pause()
        app.refresh_panels()
        await pilot.pause()
        expected = ["".join(seg.text for seg in strip).rstrip() for strip in app.screen._compositor.render_strips()]

    def shown() -> list[str]:
        return subprocess.run(
            ["tmux", "capture-pane", "-t", session, "-p"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()

    def differ(lines: list[str]) -> list[tuple[str, str]]:
        # The header and the position bar say the speed (16x there, 1x here); everything else must match.
        return [(a, b) for a, b in zip(expected, lines) if a.rstrip() != b.rstrip() and "1x" not in a]

    async def until(done, timeout: float) -> list[str]:  # noqa: ANN001
        """The pane's lines once `done(lines)`, looked at every 0.1 s, or as they are after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not done(lines := shown()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return lines

    session = f"rw-crop-{tmp_path.name}"[:40]
    command = " ".join([*rampwatch_cmd(), "replay", str(recording), "--speed", "16", "--refresh", "0.1"])
    # The replay starts once the window has its size: a detached session takes tmux's default size unless told.
    subprocess.run(
        [
            "tmux",
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "120",
            "-y",
            "40",
            f"tmux wait-for {session}; TERM=xterm-256color {command}; sleep 60",
        ],
        check=True,
        timeout=10,
    )
    try:
        subprocess.run(["tmux", "resize-window", "-t", session, "-x", "120", "-y", "40"], check=True, timeout=10)
        subprocess.run(["tmux", "wait-for", "-S", session], check=True, timeout=10)
        # About 90 s of the recorded run at 16x, drawn ten times a second: many cropped updates. Its engine ran 10x
        # faster than real time, and the position bar shows the modelled time: 15 minutes.
        lines = await until(lambda lines: played(lines) >= 900, 60.0)
        assert played(lines) >= 900, lines
        subprocess.run(["tmux", "send-keys", "-t", session, "End"], check=True, timeout=10)
        lines = await until(lambda lines: len(lines) >= 38 and not differ(lines), 30.0)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=10)
    assert len(lines) >= 38 and not differ(lines), differ(lines)[:3]


def played(lines: list[str]) -> int:
    """The time the replay's position bar shows (`H:MM:SS / H:MM:SS`), in seconds; -1 before it is drawn."""
    for line in lines:
        if m := re.search(r"(\d+):(\d\d):(\d\d) / \d+:\d\d:\d\d", line):
            h, mm, ss = map(int, m.groups())
            return h * 3600 + mm * 60 + ss
    return -1


def test_a_changed_wide_character_is_repainted_whole():
    from rich.segment import Segment

    from rampwatch.tui.widgets.dirty import cells, changed_span

    assert changed_span(cells([Segment("ab中")]), cells([Segment("ab文")])) == (2, 4)
    assert changed_span(cells([Segment("ab中x")]), cells([Segment("ab中y")])) == (4, 5)
    assert changed_span(cells([Segment("7.6s")]), cells([Segment("7.6s")])) is None
    assert changed_span(cells([Segment("12.5s")]), cells([Segment("9.1s")])) == (
        0,
        5,
    )  # shorter: cleared to its old end
