"""The Textual app: one main screen of panels, fed by a live run or a replay.

The app reads the source's RunState on a timer (--refresh), never per
token, and only renders: figures come from drivers/model/. A tick that finds
nothing new (same events, same clock second, same size) draws nothing, and
a panel whose content did not change is not repainted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Protocol

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Static

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run import lifetime
from rampwatch.drivers.run.process import DriverProcess
from rampwatch.drivers.run.recording import Recording
from rampwatch.tui import terminal_output
from rampwatch.tui.fmt import clock
from rampwatch.tui.refresh import REFRESH_S as DEFAULT_REFRESH_S
from rampwatch.tui.sources import FollowSource, LiveSource, ReplaySource
from rampwatch.tui.widgets.base import ChangingStatic
from rampwatch.tui.widgets.events import EventsPanel
from rampwatch.tui.widgets.focus import SessionScreen
from rampwatch.tui.widgets.gpus import GpuPanel
from rampwatch.tui.widgets.header import HeaderBar
from rampwatch.tui.widgets.prefill import PrefillPanel
from rampwatch.tui.widgets.report import ReportScreen
from rampwatch.tui.widgets.server import ServerPanel
from rampwatch.tui.widgets.sessions import SessionsTable
from rampwatch.tui.widgets.timeline import TimelinePanel

COMPACT_WIDTH, COMPACT_HEIGHT = 100, 30


class Source(Protocol):
    """What the app reads: a live run (LiveSource) or a replay (ReplaySource)."""

    @property
    def state(self) -> RunState: ...
    def attach(self, loop: asyncio.AbstractEventLoop) -> None: ...
    @property
    def finished(self) -> bool: ...
    def now(self) -> float: ...
    def mode(self) -> str: ...
    def recording(self) -> str | None: ...
    def tick(self, dt: float) -> None: ...
    def mark(self, note: str) -> bool: ...


class PositionBar(ChangingStatic):
    """Replay position: time, a bar with turn marks, speed and state."""

    def show(self, src: ReplaySource) -> None:
        width = max(10, self.size.width - 40)
        end = src.end_t or 1.0
        cells = ["─"] * width
        for t in src.turn_marks:
            cells[min(width - 1, int(t / end * (width - 1)))] = "┬"
        head = min(width - 1, int(src.position / end * (width - 1)))
        end_modelled = src.state.modelled_time(src.end_t)  # the bar's positions are recorded times; the clock modelled
        t = Text(f" {'⏸' if src.paused else '▶'} {clock(src.now())} / {clock(end_modelled)} ", style="bold")
        t.append("".join(cells[:head]), style="green")
        t.append("●", style="bold yellow")
        t.append("".join(cells[head + 1 :]), style="dim")
        t.append(f"  {src.speed:g}x", style="bold")
        self.show_content(t)


HELP = """[b]rampwatch keys[/b]

  q            quit (a live run: sessions stop cleanly, the recording is closed)
  r            report: a sortable table per session, the summary, TTFT per turn
  m            mark this moment (recorded as an event)
  ↑ / ↓        move the cursor in Sessions (also the mouse wheel and a click)
  enter        the selected session's own screen (escape returns)
  s            sort Sessions: id, state, TTFT (slowest first), tok/s (slowest first), turn
  /            filter Sessions (e.g. prefilling, decoding, s12); empty clears
  ?            this help
  ctrl+p       command palette

[b]replay[/b]
  space        pause / resume
  + / -        speed up / down (0.25x to 64x)
  ← / →        seek 10 s back / forward
  [ / ]        previous / next turn
  home / end   go to start / end
  .            step to the next event

[b]panels[/b]
  Sessions: an aggregate line, then per session turn k/N, context, state
    (prefilling shows how long), last TTFT, current decode tok/s, stall (red:
    waiting for the next token now), cached share, needle per turn.
  Decode tokens/s: per session, one cell a second; red cells: another session
    was prefilling. With many sessions: the most affected, then p50 and min.
  Prefill in flight: elapsed wait, expected total from the last prefill rate.
  Server: KV occupancy, prefix hit rate, requests, throughput, preemptions;
    a metric the server does not expose says why.
"""


class FilterScreen(ModalScreen[str]):
    """One line: what the Sessions rows must contain (state or id)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, current: str):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        yield Input(
            value=self.current,
            placeholder="filter sessions: prefilling, decoding, queued, s12 … (empty: all)",
            id="filter-input",
        )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(self.current)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(HELP)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class RampwatchApp(App[int]):
    """The main screen of panels over one source; `autostart=False` leaves the
    timer off so tests step it with refresh_panels()."""

    CSS_PATH = "app.tcss"
    TITLE = "rampwatch"
    BINDINGS = [
        Binding("q,ctrl+c", "quit", "quit", priority=True),
        Binding("r", "report", "report"),
        Binding("m", "mark", "mark"),
        Binding("s", "sort", "sort"),
        Binding("slash", "filter", "filter"),
        Binding("question_mark", "help", "help"),
        Binding("space", "pause", "pause", show=False),
        Binding("plus,equals_sign", "speed(1)", "faster", show=False),
        Binding("minus", "speed(-1)", "slower", show=False),
        Binding("left", "seek(-10)", "-10s", show=False),
        Binding("right", "seek(10)", "+10s", show=False),
        Binding("left_square_bracket", "turn(-1)", "prev turn", show=False),
        Binding("right_square_bracket", "turn(1)", "next turn", show=False),
        Binding("home", "seek_to(0)", "start", show=False),
        Binding("end", "seek_to(-1)", "end", show=False),
        Binding("full_stop", "step", "step", show=False),
    ]

    def __init__(self, source: Source, refresh_s: float = DEFAULT_REFRESH_S, autostart: bool = True):
        super().__init__()
        terminal_output.install()  # a changed figure costs its own cells on the terminal, not its row's
        self.source = source
        self.refresh_s = refresh_s
        self.autostart = autostart
        self.ticks = 0
        self.stop_signal: int | None = None
        self._last_tick = time.monotonic()
        self._marks = 0
        self._drawn: tuple[object, ...] | None = None  # what the last drawn tick showed
        self._sessions_laid_out: tuple[int, int] | None = None

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield SessionsTable("Sessions", id="sessions")
                yield PrefillPanel("Prefill in flight", id="prefill")
                yield TimelinePanel("Decode tokens/s", id="timeline")
            with Vertical(id="right"):
                yield ServerPanel("Server", id="server")
                yield GpuPanel("GPUs", id="gpus")
        yield EventsPanel("Events", id="events")
        if isinstance(self.source, ReplaySource):
            yield PositionBar(id="position")
        yield Footer()

    def get_system_commands(self, screen):  # noqa: ANN001, ANN201
        """rampwatch's keys in the command palette (ctrl+p), beside Textual's own."""
        yield from super().get_system_commands(screen)
        yield SystemCommand("Report", "The per-turn table of the run so far (r)", self.action_report)
        yield SystemCommand("Mark", "Record a mark at this moment (m)", self.action_mark)
        yield SystemCommand("Help", "Keys and panels (?)", self.action_help)
        if isinstance(self.source, ReplaySource):
            yield SystemCommand("Pause / resume", "Replay (space)", self.action_pause)
            yield SystemCommand("Faster", "Replay speed up (+)", lambda: self.action_speed(1))
            yield SystemCommand("Slower", "Replay speed down (-)", lambda: self.action_speed(-1))
            yield SystemCommand("Go to start", "Replay (home)", lambda: self.action_seek_to(0))
            yield SystemCommand("Go to end", "Replay (end)", lambda: self.action_seek_to(-1))

    def on_mount(self) -> None:
        self.source.attach(asyncio.get_running_loop())
        self._apply_size(self.size.width, self.size.height)
        # Looked up once: the tick redraws them on every refresh.
        self._header = self.query_one(HeaderBar)
        self._sessions = self.query_one(SessionsTable)
        self._sessions.focus()
        self._panels = [self.query_one(p) for p in (TimelinePanel, PrefillPanel, ServerPanel, GpuPanel, EventsPanel)]
        self._position = self.query_one(PositionBar) if isinstance(self.source, ReplaySource) else None
        if self.autostart:
            self.set_interval(self.refresh_s, self.refresh_panels)
        self.refresh_panels()
        try:  # Ctrl-C, SIGTERM and SIGHUP quit as `q` does; the process ends after (stop_on_signals)
            lifetime.handle_stop_signals(asyncio.get_running_loop(), self._on_signal)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests): the keys still work

    def _on_signal(self, sig: int) -> None:
        self.stop_signal = sig
        self.exit()

    def on_resize(self, event) -> None:  # noqa: ANN001
        self._apply_size(event.size.width, event.size.height)

    def _apply_size(self, width: int, height: int) -> None:
        self.screen.set_class(width < COMPACT_WIDTH or height < COMPACT_HEIGHT, "-compact")
        self._sessions_laid_out = None  # panel heights depend on the form
        self._drawn = None

    def _lay_out(self, state: RunState) -> None:
        """Fix the panels' heights for this many sessions: set when the count
        changes, never recomputed from content on a tick."""
        n = len(state.sessions)
        endpoints = sum(1 for ep in state.endpoints.values() if ep.last_sample_t is not None)
        note = state.usage_has_cache is False  # the Server panel's "per-request cached tokens unavailable"
        if (n, len(state.gpus), endpoints, note) == self._sessions_laid_out:
            return
        self._sessions_laid_out = (n, len(state.gpus), endpoints, note)
        compact = self.screen.has_class("-compact")
        if (
            not compact
        ):  # one endpoint: 8 lines (and the note); more: KV, history, capacity, hit, a head, a row each, the total
            lines = 8 + note if endpoints <= 1 else 4 + note + endpoints + 2
            self.query_one(ServerPanel).styles.height = lines + 2
        frame = 1 if compact else 2  # compact panels have a top rule only
        gpu_rows = len(panels.gpu_nodes(state)) if compact else len(state.gpus)  # compact: a line per node
        gpus = max(2, min(8, gpu_rows)) + frame
        # Rows left for Sessions, Prefill in flight and the decode chart, beside
        # the header, events, footer (and in compact form the server and GPUs).
        fixed = 1 + (4 if compact else 9) + 1 + (self._position is not None) + (4 + gpus if compact else 0)
        room = max(6, self.size.height - fixed)
        share = room // 2 if compact else room * 2 // 5
        sessions = min(n + 3, max(4, share - frame)) + frame  # the aggregate (1-2 lines), the heads, the rows
        prefill = min(max(1, n), max(1, room // 5 - frame)) + frame
        self._sessions.styles.height = sessions
        self.query_one(PrefillPanel).styles.height = prefill
        if compact:
            self.query_one(TimelinePanel).styles.height = max(1 + frame, min(n + frame, room - sessions - prefill))
            self.query_one(GpuPanel).styles.height = gpus
        else:
            self.query_one(TimelinePanel).styles.height = "1fr"
            self.query_one(GpuPanel).styles.height = "1fr"

    def refresh_panels(self) -> None:
        """One UI tick: advance a replay, then redraw the panels from the state
        if anything they show can have changed."""
        now_wall = time.monotonic()
        dt, self._last_tick = now_wall - self._last_tick, now_wall
        src = self.source
        src.tick(dt)
        state, now = src.state, src.now()
        # Elapsed prefill times tick once a refresh; otherwise only the clock's second moves.
        clock_key = int(now / self.refresh_s) if state.prefilling() else int(now)
        key = (state.version, clock_key, self.size, src.mode(), id(state))
        self.ticks += 1
        if key == self._drawn:
            return
        self._drawn = key
        if isinstance(self.screen, SessionScreen):
            self.screen.show(state, now)
            return
        self._lay_out(state)
        self._header.show(state, now, src.mode(), src.recording())
        self._sessions.show(state, now)
        for panel in self._panels:
            panel.show(state, now)
        if self._position is not None:
            self._position.show(src)  # type: ignore[arg-type]

    # -- actions -----------------------------------------------------------------

    def action_report(self) -> None:
        self.push_screen(ReportScreen(build_report(self.source.state)))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_sort(self) -> None:
        self.notify(f"sessions sorted by {self._sessions.cycle_sort()}")
        self.redraw()

    def action_filter(self) -> None:
        def apply(text: str | None) -> None:
            self._sessions.filter = text or ""
            self.redraw()

        self.push_screen(FilterScreen(self._sessions.filter), apply)

    def on_sessions_table_open(self, message: SessionsTable.Open) -> None:
        self.push_screen(SessionScreen(message.session))
        self.call_after_refresh(self.redraw)

    def redraw(self) -> None:
        """Draw at once, whatever the last tick drew (after a key changed what is shown)."""
        self._drawn = None
        self.refresh_panels()

    def action_mark(self) -> None:
        self._marks += 1
        if self.source.mark(f"mark {self._marks}"):
            self.notify(f"mark {self._marks} recorded")
        else:
            self.notify("marks are recorded in live runs only", severity="warning")

    def _replay(self) -> ReplaySource | None:
        return self.source if isinstance(self.source, ReplaySource) else None

    def action_pause(self) -> None:
        if (r := self._replay()) is not None:
            r.paused = not r.paused
            self.refresh_panels()

    def action_speed(self, direction: int) -> None:
        if (r := self._replay()) is not None:
            r.change_speed(direction)
            self.refresh_panels()

    def action_seek(self, seconds: float) -> None:
        if (r := self._replay()) is not None:
            r.seek(r.position + seconds)
            self.refresh_panels()

    def action_seek_to(self, where: float) -> None:
        if (r := self._replay()) is not None:
            r.seek(r.end_t if where < 0 else where)
            self.refresh_panels()

    def action_turn(self, direction: int) -> None:
        if (r := self._replay()) is not None:
            r.seek_turn(direction)
            self.refresh_panels()

    def action_step(self) -> None:
        if (r := self._replay()) is not None:
            r.step()
            self.refresh_panels()


def run_app_live(driver: DriverProcess, refresh_s: float = DEFAULT_REFRESH_S) -> int:
    """Show a started driver process's run; returns the run's exit code once
    the user quits (the driver is stopped cleanly) or the run has ended."""
    source = LiveSource(driver)
    app = RampwatchApp(source, refresh_s=refresh_s)
    try:
        app.run()
    finally:
        code = source.stop(app.stop_signal)  # a SIGTERM/SIGHUP's exit code (143/129) comes back from the run
    return code


def run_app_replay(recording: Recording, speed: float = 1.0, refresh_s: float = DEFAULT_REFRESH_S) -> int:
    RampwatchApp(ReplaySource(recording, speed=speed), refresh_s=refresh_s).run()
    lifetime.stop_on_signals()  # ended by SIGTERM/SIGHUP: exit 143/129, not 0
    return 0


def run_app_follow(path: Path, refresh_s: float = DEFAULT_REFRESH_S) -> int:
    """A run as its recording grows (one browser page of --web)."""
    RampwatchApp(FollowSource(path), refresh_s=refresh_s).run()
    lifetime.stop_on_signals()  # ended by SIGTERM/SIGHUP: exit 143/129, not 0
    return 0
