"""The GPU panel: one line per GPU, or per node where they do not fit."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import panels
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.state import RunState
from rampwatch.tui.fmt import bar, whole
from rampwatch.tui.widgets.base import Panel


class GpuPanel(Panel):
    """One line per GPU: utilisation, memory, power, SM clock, temperature; or why there is none.
    GPUs of several nodes carry their node's name; where they do not fit (and in the
    compact form) each node is one line: its GPUs' utilisation min/mean/max."""

    def render_state(self, state: RunState, now: float) -> object:
        if not state.gpus:
            reason = state.gpu_reason or "no GPU source yet"
            return Text(reason if reason.startswith("no GPU") else f"no GPU source: {reason}", style="dim")
        nodes = panels.gpu_nodes(state)
        height = max(1, self.size.height)
        if self.compact or len(state.gpus) > height:
            return Group(*(node_line(node, gpus, self.size.width) for node, gpus in nodes[:height]))
        label_w = min(12, max(len(n) for n, _ in nodes)) if len(nodes) > 1 else 0
        return Group(*(gpu_line(g, label_w, self.size.width) for _, gpus in nodes for g in gpus))


def gpu_line(g: ev.GpuReading, label_w: int, width: int) -> Text:
    """One GPU: [node] index, a utilisation bar, util %, then memory, power, SM clock and
    temperature as long as they fit the panel's width."""
    extras = [
        f"  mem {g.mem_used / 2**30:.0f}/{g.mem_total / 2**30:.0f}G"
        if g.mem_used is not None and g.mem_total
        else "  mem -"
    ]
    if g.power is not None:
        extras.append(f"  {g.power:.0f}" + (f"/{g.power_limit:.0f}W" if g.power_limit else "W"))
    extras += [f"  {whole(g.sm_clock)}MHz", f"  {whole(g.temp)}°C"]
    label, index = (f"{g.node[:label_w]:<{label_w}} " if label_w else ""), f"{g.index} "
    fixed = len(label) + len(index) + 6  # the bar's value: " 100%"
    while extras and fixed + sum(len(x) for x in extras) + 8 > width:
        extras.pop()  # temperature first, then clock, power, memory: the bar keeps at least 8 cells
    line = Text(label, style="dim")
    line.append(index, style="bold")
    line.append_text(
        bar(None if g.util is None else g.util / 100, max(4, width - fixed - sum(len(x) for x in extras)), "magenta")
    )
    line.append(f" {whole(g.util):>3}%" + "".join(extras))
    return line


def node_line(node: str, gpus: list[ev.GpuReading], width: int) -> Text:
    """One node: its GPU count, utilisation min/mean/max with a bar of the mean, memory and power summed."""
    utils = [g.util for g in gpus if g.util is not None]
    mean = sum(utils) / len(utils) if utils else None
    line = Text(f"{(node or 'local')[:14]:<14} ", style="bold")
    line.append(counted(len(gpus), "GPU") + " ")
    line.append_text(bar(None if mean is None else mean / 100, max(4, width - 76), "magenta"))
    line.append(
        f" util min {whole(min(utils, default=None))} mean {whole(mean)} max {whole(max(utils, default=None))}%"
    )
    used = [g.mem_used for g in gpus if g.mem_used is not None]
    total = [g.mem_total for g in gpus if g.mem_total]
    if used and total:
        line.append(f"  mem {sum(used) / 2**30:.0f}/{sum(total) / 2**30:.0f}G")
    power = [g.power for g in gpus if g.power is not None]
    if power:
        line.append(f"  {sum(power) / 1000:.1f}kW")
    return line
