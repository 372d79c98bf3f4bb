"""The prefill panel: each session waiting for its first token, and how far it is likely to be."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.state import RunState
from rampwatch.tui.fmt import bar, duration, format_tokens, pct
from rampwatch.tui.widgets.base import Panel


class PrefillPanel(Panel):
    """Each session waiting for its first token: elapsed time, new tokens, expected total."""

    def render_state(self, state: RunState, now: float) -> object:
        progress = sorted(panels.prefill_progress(state, now), key=lambda p: -p.elapsed)  # the longest wait first
        if not progress:
            return Text("no prefill in flight", style="dim")
        rows = []
        width = max(8, self.size.width - 52)
        fit = max(1, self.size.height)
        shown = progress if len(progress) <= fit else progress[: max(1, fit - 1)]
        for p in shown:
            line = Text(f"{p.session} turn {p.turn}", style="bold yellow")
            line.append(f"  ~{format_tokens(p.new_tokens)} new  {duration(p.elapsed)}")
            if p.expected is not None:
                line.append(f" / ~{duration(p.expected)}  ")
                line.append_text(bar(p.fraction, width, "yellow"))
                line.append(f" {pct(p.fraction)}")
            else:
                line.append("  (no earlier prefill rate to estimate from)", style="dim")
            rows.append(line)
        if len(shown) < len(progress):
            more = Text(f"+{len(progress) - len(shown)} more prefilling", style="dim")
            if len(rows) < fit:
                rows.append(more)
            else:  # one row: the longest wait, and how many more
                rows[-1] = Text.assemble(rows[-1][: max(0, self.size.width - len(more) - 2)], "  ", more)
        return Group(*rows)
