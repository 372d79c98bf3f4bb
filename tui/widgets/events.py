"""The events panel: the newest entries of the run's log."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from rampwatch.drivers.model.log import collapsed_log
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.turn_text import log_text
from rampwatch.tui.fmt import clock
from rampwatch.tui.widgets.base import Panel

LEVEL_STYLE = {"info": "", "warn": "yellow", "error": "bold red", "mark": "bold magenta"}


class EventsPanel(Panel):
    """The newest log entries: finished turns, errors, outages, marks."""

    def render_state(self, state: RunState, now: float) -> object:
        height = max(1, self.size.height)  # size is the content box: borders excluded
        entries = collapsed_log(list(state.log))[-height:]  # the log is bounded (LOG_LEN)
        if not entries:
            return Text("no events yet", style="dim")
        lines = []
        for entry in entries:
            line = Text(f"{clock(entry.t)} ", style="dim", no_wrap=True, overflow="ellipsis")
            line.append(log_text(entry), style=LEVEL_STYLE.get(entry.level, ""))
            lines.append(line)
        return Group(*lines)
