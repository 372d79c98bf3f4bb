"""The panels of the main screen. Each renders one part of a RunState it is
handed; none computes statistics (drivers/model/ does). A panel repaints
only when what it would show differs from what it shows; its height is set
by the app, so an update never relays out the screen."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.text import Text
from textual.geometry import Region
from textual.widgets import Static

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.endpoints import EndpointView, ServerView
from rampwatch.drivers.model.log import collapsed_log
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.views import TIMELINE_BUCKET_S, SessionView
from rampwatch.tui.fmt import bar, clock, duration, format_tokens, pct, rate, sparkline, whole
from rampwatch.tui.widgets.dirty import Cell, cells, dirty_regions

LEVEL_STYLE = {"info": "", "warn": "yellow", "error": "bold red", "mark": "bold magenta"}


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


class HeaderBar(ChangingStatic):
    """One line: mode, run clock, model, engine, server, recording path or its trouble."""

    def show(self, state: RunState, now: float, mode: str, recording: str | None) -> None:
        h = state.header
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" rampwatch ", style="bold reverse")
        alarm = "silent" in mode or "crashed" in mode
        t.append(
            f" {mode} ",
            style="bold white on red"
            if alarm
            else "bold black on yellow"
            if "replay" in mode
            else "bold black on green",
        )
        t.append(f" {clock(now)} ", style="bold")
        if h is not None:
            modes = [
                m
                for m in (
                    "lockstep" if h.lockstep else "",
                    "strict needle" if h.needle_mode == "strict" else "",
                    "one-shot" if h.one_shot else "",
                )
                if m
            ]
            if h.time_limit_s:
                modes.append(f"limit {clock(h.time_limit_s)}" + (" reached" if now >= h.time_limit_s else ""))
            if modes:
                t.append(f" {' · '.join(modes)} ", style="bold cyan")
            engine = (h.engine or state.server.engine or "?") + (f" {h.engine_version}" if h.engine_version else "")
            more = sum(1 for ep in h.endpoints if ep.url) - 1
            t.append(f" {h.model or '?'} · {engine} · {h.server}" + (f" +{more} more" if more > 0 else ""))
        if recording:
            t.append(f"  rec {recording}", style="dim")
        if h is not None and not h.tls_verified:
            t.append("  TLS NOT VERIFIED", style="bold white on red")
        if state.recording_error:
            t.append(f"  {state.recording_error}", style="bold white on red")
        ended = state.ended
        if ended is not None and ended.status == "crashed":
            t.append(f"  CRASHED: {ended.error or 'driver gone'}", style="bold white on red")
        self.show_content(t)


SETTLE_S = 0.5  # a second is drawn this long after it ends: token times reach the UI in batches (~0.3 s)


def last_whole_second(state: RunState, now: float) -> int:
    """The newest bucket a decode chart draws: whole seconds only, so it changes once a second."""
    step = TIMELINE_BUCKET_S
    return int(now // step) if state.ended else int((now - SETTLE_S) // step) - 1


def chart_start(last: int, width: int) -> int:
    """The first bucket a chart of `width` cells shows, its newest bucket `last` inside it. The chart
    moves a quarter of its width at a time, not a cell a second: between moves only the newest column
    changes, so a terminal is sent a few cells a second instead of the whole chart. It fills from
    the run's start."""
    stride = max(1, width // 4)
    overflow = last - (width - 1)
    return -(-overflow // stride) * stride if overflow > 0 else 0


def prefill_legend(lead: str) -> Text:
    legend = Text(lead, style="dim")
    legend.append("  ", style="on #5f0000")
    legend.append(" another session prefilling", style="dim")
    return legend


class TimelinePanel(Panel):
    """Decode tokens/s per session over time, one cell per second; red cells:
    another session was prefilling. It draws whole seconds only, so it is
    rebuilt once a second, not on every tick."""

    LABEL = 13

    _cache_key: tuple[object, ...] | None = None
    _cached: object = None

    def render_state(self, state: RunState, now: float) -> object:
        if not state.sessions:
            return Text("")
        last = last_whole_second(state, now)
        key = (last, self.size, self.compact, len(state.sessions), id(state))
        if key != self._cache_key:
            self._cache_key, self._cached = key, self._draw(state, last, now)
        return self._cached

    def _draw(self, state: RunState, last: int, now: float) -> object:
        width = max(10, self.size.width - self.LABEL)
        step = TIMELINE_BUCKET_S
        first = chart_start(last, width)
        start = first * step
        space = max(1, self.size.height - (0 if self.compact else 1))  # rows for lanes (the legend takes one)
        sessions = list(state.sessions.values())
        aggregate = len(sessions) > space
        lanes = self._by_interest(sessions, now)[: max(0, space - 2)] if aggregate else sessions
        rows = 1 if self.compact or aggregate else max(1, min(10, space // max(1, len(lanes))))
        out = []
        for s in lanes:
            values = s.timeline_values(first, width)
            marks = state.foreign_prefill_cells(s.id, start, step, width, now)
            top = max(values) or 1.0
            for k, line in enumerate(sparkline(values, top, marks, rows=rows)):
                label = f"{s.id:<5}{top:>6.0f}▕ " if k == 0 else f"{'':11}▕ "
                out.append(Text(label, style="bold" if k == 0 else "dim") + line)
        if aggregate:
            p50, low = state.timeline_aggregate(first, width)
            marks = state.foreign_prefill_cells("", start, step, width, now)  # any session prefilling
            top = max(p50) or 1.0
            out.append(Text(f"{'p50':<5}{top:>6.0f}▕ ", style="bold") + sparkline(p50, top, marks)[0])
            if space >= 2:
                out.append(Text(f"{'min':<11}▕ ", style="bold") + sparkline(low, top, marks)[0])
        if not self.compact:
            lanes_note = f"lanes: {len(lanes)}/{len(sessions)}, p50/min of all  " if aggregate else ""
            out.append(prefill_legend(f"{'':5}peak tok/s, 1 cell = {step:g}s  {lanes_note}"))
        return Group(*out)

    @staticmethod
    def _by_interest(sessions: list[SessionView], now: float) -> list[SessionView]:
        """Who gets a lane when not all fit: those prefilling (longest wait
        first), then those decoding slowest, then the rest."""

        def key(s: SessionView) -> tuple[int, float]:
            if s.state == "prefilling" and s.current is not None:
                return (0, s.current.sent_t)
            if s.state == "decoding":
                return (1, s.decode_rate_now() or 0.0)
            return (2, 0.0)

        return sorted(sessions, key=key)


class PrefillPanel(Panel):
    """Each session waiting for its first token: elapsed time, new tokens, expected total."""

    def render_state(self, state: RunState, now: float) -> object:
        progress = sorted(state.prefill_progress(now), key=lambda p: -p.elapsed)  # the longest wait first
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


# What makes each engine put cached tokens in a response's usage.
CACHE_REPORT_FLAGS = {
    "vllm": "vLLM: --enable-prompt-tokens-details",
    "sglang": "SGLang: --enable-cache-report",
    "llama.cpp": "llama.cpp: a build with prompt_tokens_details",
}


class ServerPanel(Panel):
    """KV cache, prefix hit rate, requests, throughput, preemptions; an unexposed metric says why."""

    def render_state(self, state: RunState, now: float) -> object:
        srv = state.server
        v, missing = srv.values, srv.missing
        answered = [ep for ep in state.endpoints.values() if ep.last_sample_t is not None]
        rows = {ep.name for ep in answered} if len(answered) > 1 and not self.compact else set()  # say it in their row
        lines = [
            Text(f"metrics {src}: {err}", style="bold red")
            for src, err in state.metrics_errors().items()
            if src not in rows
        ]
        if srv.last_sample_t is None:
            lines.append(Text("waiting for the first /metrics scrape…", style="dim"))
            return Group(*lines)
        width = max(8, self.size.width - 30)

        def why(field: str) -> Text:
            return Text(f"unavailable: {missing.get(field, 'not exposed')}", style="dim italic")

        last_hit = state.last_turn_hit_rate()
        if self.compact:
            worst = self._worst(answered) if len(answered) > 1 else []
            return Group(*lines, *self._compact(state, last_hit), *worst)
        kv = v.get("kv_usage")
        line = Text("KV cache ", style="bold")
        if kv is None:
            line.append_text(why("kv_usage"))
        else:
            line.append_text(bar(kv, width, "red" if kv > 0.9 else "green"))
            line.append(f" {pct(kv)} (peak {pct(srv.kv_peak)})")
        lines.append(line)
        history = [x for _, x in list(srv.kv_history)[-width:]]
        if history:
            lines.append(Text("  history ", style="dim") + sparkline(history, 1.0, style="green")[0])
        cap = v.get("kv_capacity_tokens")
        fits = state.kv_fits_sequences()
        line = Text("capacity ", style="bold")
        if cap is None:
            line.append_text(why("kv_capacity_tokens"))
        else:
            line.append(f"{format_tokens(cap)} tokens")
            if fits is not None:
                line.append(f" · fits {fits}× longest")
        lines.append(line)
        line = Text("prefix hit ", style="bold")
        if "prefix_hits" not in v and last_hit is None:
            line.append_text(why("prefix_hits"))
        else:
            line.append(f"last turn {pct(last_hit)} · since start {pct(state.hit_rate_since_start())}")
        lines.append(line)
        if len(answered) > 1:  # one row per endpoint and the total: requests, rates and preemptions are there
            return Group(*lines, *endpoint_table(state, answered, self.size.width))
        if state.sessions and state.usage_reports_cache() is False:
            flag = CACHE_REPORT_FLAGS.get(srv.engine or "", "vLLM: --enable-prompt-tokens-details")
            lines.append(Text(f"  per-request cached tokens unavailable ({flag})", style="dim italic"))
        line = Text("requests ", style="bold")
        line.append(f"running {whole(v.get('running'))} · waiting {whole(v.get('waiting'))}")
        lines.append(line)
        line = Text("throughput ", style="bold")
        line.append(f"prefill {rate(srv.prefill_rate)} · decode {rate(srv.decode_rate)} tok/s")
        lines.append(line)
        pre = state.preemptions_this_run()
        line = Text("preemptions ", style="bold")
        if pre is None:
            line.append_text(why("preemptions"))
        else:
            line.append(f"{pre:.0f} this run", style="bold red" if pre > 0 else "")
        lines.append(line)
        return Group(*lines)

    def _compact(self, state: RunState, last_hit: float | None) -> list[Text]:
        """Two lines: KV, capacity and hit rate; requests, throughput, preemptions."""
        srv = state.server
        v = srv.values
        kv = v.get("kv_usage")
        one = Text("KV ", style="bold")
        if kv is None:
            one.append("unavailable", style="dim italic")
        else:
            one.append_text(bar(kv, 12, "red" if kv > 0.9 else "green"))
            one.append(f" {pct(kv)} peak {pct(srv.kv_peak)}")
        fits = state.kv_fits_sequences()
        if fits is not None:
            one.append(f" · fits {fits}×")
        one.append(" · hit ", style="bold")
        one.append(f"{pct(last_hit)} last, {pct(state.hit_rate_since_start())} run")
        two = Text("req ", style="bold")
        two.append(f"{whole(v.get('running'))} run {whole(v.get('waiting'))} wait")
        two.append(" · tok/s ", style="bold")
        two.append(f"prefill {rate(srv.prefill_rate)} decode {rate(srv.decode_rate)}")
        pre = state.preemptions_this_run()
        two.append(" · preempt ", style="bold")
        two.append("-" if pre is None else f"{pre:.0f}")
        return [one, two]

    @staticmethod
    def _worst(answered: list[EndpointView]) -> list[Text]:
        """The endpoint under most pressure (fullest KV, then most waiting), for the compact form."""
        ep = max(answered, key=lambda x: (x.values.get("kv_usage", -1.0), x.values.get("waiting", 0.0)))
        v = ep.values
        line = Text("worst ", style="bold")
        line.append(
            f"{ep.name}: KV {pct(v.get('kv_usage'))} · {whole(v.get('running'))} run "
            f"{whole(v.get('waiting'))} wait · hit {pct(ep.hit_rate_since_start())}"
        )
        return [line]


# The per-endpoint table's columns, most wanted first: (head, width, cell); kept while they fit.
ENDPOINT_COLUMNS: list[tuple[str, int, Callable[[EndpointView | None, ServerView], str]]] = [
    ("KV", 4, lambda ep, srv: pct((ep or srv).values.get("kv_usage"))),
    ("run", 3, lambda ep, srv: whole((ep or srv).values.get("running"))),
    ("wait", 4, lambda ep, srv: whole((ep or srv).values.get("waiting"))),
    ("prefill", 7, lambda ep, srv: rate((ep or srv).prefill_rate)),
    ("decode", 6, lambda ep, srv: rate((ep or srv).decode_rate)),
    ("hit", 4, lambda ep, srv: pct((ep or srv).hit_rate_since_start())),
    ("role", 7, lambda ep, srv: ep.role if ep else ""),
    ("pre", 3, lambda ep, srv: whole((ep.since_start() if ep else srv.values).get("preemptions"))),
]


def endpoint_table(state: RunState, answered: list[EndpointView], width: int) -> list[Text]:
    """One row per endpoint (tok/s since its window, hit rate since it first
    answered) and a total row, as many columns as fit; a failing endpoint says so."""
    name_w = max(5, min(16, max(len(ep.name) for ep in answered)))
    cols, used = [], name_w
    for col in ENDPOINT_COLUMNS:
        if used + 1 + col[1] > width:
            break
        cols.append(col)
        used += 1 + col[1]
    head = Text(f"{'endpoint':<{name_w}}", style="bold")
    for title, w, _ in cols:
        head.append(f" {title:>{w}}", style="bold")
    rows = [head]
    for ep in [*answered, None]:
        name = "total" if ep is None else ep.name
        line = Text(f"{name[:name_w]:<{name_w}}", style="bold" if ep is None else "")
        if ep is not None and ep.error:
            line.append(f" {ep.error}"[: width - name_w], style="bold red")
        else:
            for _, w, cell in cols:
                line.append(f" {cell(ep, state.server):>{w}}")
        rows.append(line)
    return rows


class GpuPanel(Panel):
    """One line per GPU: utilisation, memory, power, SM clock, temperature; or why there is none.
    GPUs of several nodes carry their node's name; where they do not fit (and in the
    compact form) each node is one line: its GPUs' utilisation min/mean/max."""

    def render_state(self, state: RunState, now: float) -> object:
        if not state.gpus:
            reason = state.gpu_reason or "no GPU source yet"
            return Text(reason if reason.startswith("no GPU") else f"no GPU source: {reason}", style="dim")
        nodes = state.gpu_nodes()
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
    line.append(f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ")
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


class EventsPanel(Panel):
    """The newest log entries: finished turns, errors, outages, marks."""

    def render_state(self, state: RunState, now: float) -> object:
        height = max(1, self.size.height)  # size is the content box: borders excluded
        entries = collapsed_log(list(state.log))[-height:]  # the log is bounded (LOG_LEN)
        if not entries:
            return Text("no events yet", style="dim")
        lines = []
        for t, level, text, _ in entries:
            line = Text(f"{clock(t)} ", style="dim", no_wrap=True, overflow="ellipsis")
            line.append(text, style=LEVEL_STYLE.get(level, ""))
            lines.append(line)
        return Group(*lines)
