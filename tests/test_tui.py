"""The Textual UI, driven by Pilot: replay stepped deterministically, a live
run quit midway, and SVG snapshots of the main screen."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from textual.pilot import Pilot

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import Recording, read_recording
from rampwatch.tui.app import RampwatchApp
from rampwatch.tui.sources import ReplaySource
from rampwatch.tui.widgets.events import EventsPanel
from rampwatch.tui.widgets.gpus import GpuPanel
from rampwatch.tui.widgets.prefill import PrefillPanel
from rampwatch.tui.widgets.server import ServerPanel
from rampwatch.tui.widgets.sessions import SessionsTable
from rampwatch.tui.widgets.timeline import TimelinePanel
from tests.test_picture_waits import timed_demo
from tests.test_state_analysis import header, two_session_run

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "recordings" / "glm-like-2x1m.sample.jsonl"


def sessions_text(app: RampwatchApp) -> str:
    return "\n".join(app.query_one(SessionsTable).lines_text())


def replay_app(events: list[ev.AnyEvent], header_: ev.Header | None = None) -> tuple[RampwatchApp, ReplaySource]:
    src = ReplaySource(Recording(header=header_ or header(), events=events))
    src.paused = True  # the test moves the position itself
    return RampwatchApp(src, autostart=False), src


async def show_at(pilot: Pilot, t: float | None = None) -> None:
    """Move the paused replay to `t` (its end by default) and let the panels draw what is known there."""
    src = pilot.app.source
    src.seek(src.end_t if t is None else t)
    pilot.app.refresh_panels()
    await pilot.pause()


async def test_prefilling_session_shows_as_prefilling_with_elapsed_time():
    app, _ = replay_app(two_session_run())
    async with app.run_test(size=(120, 40)) as pilot:
        await show_at(pilot, 10.0)  # s2 sent at 6.5 and has no first token yet
        sessions = sessions_text(app)
        s2 = next(line for line in sessions.splitlines() if line.strip().startswith("s2"))
        assert "prefilling 3.50s" in s2
        prefill = app.query_one(PrefillPanel).plain_text()
        assert "s2 turn 1" in prefill and "3.50s" in prefill
        assert "decoding" in next(line for line in sessions.splitlines() if line.strip().startswith("s1"))


async def test_needle_miss_shows_a_cross_and_report_screen_opens():
    app, _ = replay_app(two_session_run())
    async with app.run_test(size=(120, 40)) as pilot:
        await show_at(pilot)
        sessions = sessions_text(app)
        assert "✓" in next(line for line in sessions.splitlines() if line.strip().startswith("s1"))
        assert "✗" in next(line for line in sessions.splitlines() if line.strip().startswith("s2"))
        assert "needle ✗" in app.query_one(EventsPanel).plain_text()
        await pilot.press("r")
        await pilot.pause()
        assert app.screen.__class__.__name__ == "ReportScreen"
        await pilot.press("escape")


async def test_unavailable_metric_shows_its_reason():
    events = [
        ev.MetricsSample(
            t=0.5,
            source="http://x/metrics",
            engine="llama.cpp",
            values={"running": 1.0, "waiting": 0.0},
            missing={
                "kv_usage": "llama.cpp exposes no KV-cache occupancy (see /slots)",
                "preemptions": "llama.cpp does not preempt",
            },
        ),
        ev.GpuUnavailable(
            t=0.5, source="nvml", reason="no GPU source: NVML unavailable (NVML Shared Library Not Found)"
        ),
    ]
    app, _ = replay_app(events)
    async with app.run_test(size=(120, 40)) as pilot:
        await show_at(pilot, 1.0)
        server = " ".join(app.query_one(ServerPanel).plain_text().split())  # the panel wraps long reasons
        assert "unavailable: llama.cpp exposes no KV-cache occupancy" in server
        assert "llama.cpp does not preempt" in server
        assert "running 1" in server
        assert "no GPU source" in app.query_one(GpuPanel).plain_text()


async def test_timeline_marks_foreign_prefill_and_replay_keys():
    app, src = replay_app(two_session_run())
    async with app.run_test(size=(120, 40)) as pilot:
        await show_at(pilot, 22.0)
        assert "another session prefilling" in app.query_one(TimelinePanel).plain_text()
        await pilot.press("home")
        assert src.position == 0.0
        await pilot.press("right_square_bracket")
        assert src.position == 6.5  # the next turn's request
        await pilot.press("right_square_bracket")
        assert src.position == src.end_t
        await pilot.press("left_square_bracket")
        assert src.position == 6.5
        await pilot.press("left")
        assert src.position == 0.0
        await pilot.press("space")
        assert not src.paused
        await pilot.press("space")
        assert src.paused
        await pilot.press("plus")
        assert src.speed == 2.0
        await pilot.press("full_stop")
        assert src.position == 2.0 and src.paused  # the next event: s1's first token
        src.seek(6.5)
        await pilot.press("full_stop")
        assert src.position == 7.0


def test_replay_seek_back_rebuilds_the_same_state():
    src = ReplaySource(Recording(header=header(), events=two_session_run()))
    src.seek(src.end_t)
    ended = [r.ttft for r in src.state.turns]
    src.seek(3.0)
    assert src.state.turns == [] and src.state.sessions["s1"].state == "decoding"
    src.seek(src.end_t)
    assert [r.ttft for r in src.state.turns] == ended


# -- snapshots of the main screen from the shipped glm-like recording -------------


def _shipped_app() -> RampwatchApp:
    if not SHIPPED.exists():
        pytest.fail(f"shipped recording missing: {SHIPPED}")
    src = ReplaySource(read_recording(SHIPPED))
    src.seek(src.turn_marks[len(src.turn_marks) * 2 // 3] + 3.0)  # mid-ramp: one session prefilling
    src.paused = True
    return RampwatchApp(src, autostart=False)


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
def test_main_screen_snapshot(snap_compare, size):
    assert snap_compare(_shipped_app(), terminal_size=size)


async def test_keys_are_in_the_command_palette():
    app, _ = replay_app(two_session_run())
    async with app.run_test(size=(120, 40)):
        titles = [c.title for c in app.get_system_commands(app.screen)]
    for title in ("Report", "Mark", "Help", "Pause / resume", "Faster", "Go to end"):
        assert title in titles


def test_watch_headless_server_line():
    from rampwatch.tui.headless_lines import server_line

    src = ReplaySource(
        Recording(
            header=header(),
            events=[
                ev.MetricsSample(
                    t=0.0,
                    source="m",
                    engine="vllm",
                    values={
                        "kv_usage": 0.25,
                        "running": 2,
                        "waiting": 1,
                        "prefix_queries": 100,
                        "prefix_hits": 0,
                        "generation_tokens": 0,
                    },
                ),
                ev.MetricsSample(
                    t=10.0,
                    source="m",
                    engine="vllm",
                    values={
                        "kv_usage": 0.5,
                        "running": 2,
                        "waiting": 0,
                        "prefix_queries": 1100,
                        "prefix_hits": 900,
                        "generation_tokens": 500,
                    },
                ),
            ],
        )
    )
    assert server_line(src.state) == "server: no metrics yet"
    src.seek(10.0)
    assert server_line(src.state) == (
        "server: KV 50% · running 2 · waiting 0 · hit 90% · prefill - tok/s · decode 50 tok/s"
    )


async def test_stall_column_shows_a_stall_in_progress_then_the_turns_longest_gap():
    app, _ = replay_app(two_session_run())
    async with app.run_test(size=(120, 40)) as pilot:
        await show_at(pilot, 9.5)  # s1 decoding, its last token at 6.0: a 3.5 s stall while s2 prefills
        s1 = next(line for line in sessions_text(app).splitlines() if line.strip().startswith("s1"))
        assert "3.50s" in s1
        table = app.query_one(SessionsTable)
        stall = table.row_text([s.id for s in table.rows].index("s1"))
        assert any(span.style == "bold red" and "3.50s" in stall.plain[span.start : span.end] for span in stall.spans)
        await show_at(pilot, 22.5)  # s1's turn is done: its longest gap (4 s, during s2's prefill)
        s1 = next(line for line in sessions_text(app).splitlines() if line.strip().startswith("s1"))
        assert "4.00s" in s1


# -- the report screen -------------------------------------------------------------------


# The shipped recording has the engine's own timing (three more columns): 200 cells fit every column.
@pytest.mark.parametrize("size,dropped", [((80, 24), True), ((200, 50), False)])
async def test_report_screen_fits_the_terminal_and_sorts(size, dropped):
    from textual.widgets import DataTable

    from rampwatch.tui.widgets.report import ReportScreen

    app = _shipped_app()
    async with app.run_test(size=size) as pilot:
        app.source.seek(app.source.end_t)
        await pilot.press("r")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ReportScreen)
        table = screen.query_one("#turns-s1", DataTable)
        heads = [str(c.label) for c in table.columns.values()]
        assert {"turn", "TTFT s", "decode tok/s", "max gap", "needle"} <= set(heads)
        assert ("gap p50" not in heads) is dropped and table.row_count == 10
        screen.sort("s1", "TTFT s")
        ttfts = [float(table.get_row_at(i)[heads.index("TTFT s")]) for i in range(table.row_count)]
        assert ttfts == sorted(ttfts)
        screen.sort("s1", "TTFT s")
        assert float(table.get_row_at(0)[heads.index("TTFT s")]) == max(ttfts)
        assert "interference:" in str(screen.query_one("#report-summary").render())
        await pilot.press("escape")
        assert not isinstance(app.screen, ReportScreen)


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
def test_report_screen_snapshot(snap_compare, size):
    app = _shipped_app()

    async def open_report(pilot) -> None:  # noqa: ANN001
        app.source.seek(app.source.end_t)
        await pilot.press("r")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=open_report)


async def test_a_narrow_sessions_panel_before_any_needle():
    """100 columns is not compact, yet too narrow for the needle marks: sessions with none must still draw."""
    from rampwatch.tui.widgets.sessions import needle_marks

    assert needle_marks([], -5).plain == "" and needle_marks([True, False], -5).plain == "✗1/2"
    app, _ = replay_app(two_session_run())
    async with app.run_test(size=(100, 30)) as pilot:
        await show_at(pilot, 1.0)  # s1 sent, nothing finished: no needle yet
        assert any(line.strip().startswith("s1") for line in sessions_text(app).splitlines())


async def test_a_sped_up_demo_replays_in_modelled_time():
    """A recording whose header says its simulated engine ran 10x faster: the same run as above reads ten times
    longer in the Sessions and Prefill panels and the run clock, and the header says the speed-up."""
    from msgspec.structs import replace

    from rampwatch.tui.widgets.header import HeaderBar

    app, _ = replay_app(two_session_run(), replace(header(), time_scale=10.0))
    async with app.run_test(size=(160, 40)) as pilot:
        await show_at(pilot, 10.0)  # recorded seconds: s2 sent at 6.5, 3.5 s ago (35 s modelled)
        s2 = next(line for line in sessions_text(app).splitlines() if line.strip().startswith("s2"))
        assert "prefilling 35.0s" in s2, s2
        assert "35.0s" in app.query_one(PrefillPanel).plain_text()
        bar = str(app.query_one(HeaderBar).render())
        assert "0:01:40" in bar and "simulated 10x faster than real time; times shown as modelled" in bar, bar


# -- a turn's wait as the engine timed it, in the decode lanes (issue 19) ---------------------------------------------


def lane_bottom(panel_text: str, session: str) -> str:
    """The cells of a session's lane in the decode chart's text: its bottom row, where waits are drawn."""
    lines = panel_text.splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith(session + " "))
    while k + 1 < len(lines) and lines[k + 1].startswith(" " * 11 + "▕"):  # the lane's rows below its label
        k += 1
    return lines[k].split("▕ ", 1)[1]


async def lanes_at_end(events: list[ev.AnyEvent], header_: ev.Header) -> str:
    app, _ = replay_app(events, header_)
    async with app.run_test(size=(160, 50)) as pilot:
        await show_at(pilot)
        return app.query_one(TimelinePanel).plain_text()


async def test_decode_lanes_show_a_turn_queued_behind_the_others_prefill(tmp_path):
    """The demo (two sessions in lockstep, the engine timing each request): the slower session's lane shows its
    turns' queued cells (░) beside its prefill (▓), and the legend names both; live, a turn's split appears
    only with its TurnDone, which brings the engine's figures (before it, the lane draws the wait blank, as ever)."""
    rec = read_recording(timed_demo(tmp_path, time_scale="2"))  # prefills of ~2.5 s: whole one-second cells
    text = await lanes_at_end(rec.events, rec.header)
    done = [e for e in rec.events if isinstance(e, ev.TurnDone)]
    last = max(e.turn for e in done)
    slow = max((e for e in done if e.turn == last), key=lambda e: e.queued_s or 0.0)
    fast = next(e for e in done if e.turn == last and e is not slow)
    assert slow.queued_s and slow.queued_s > 1.5, slow
    slow_lane, fast_lane = lane_bottom(text, slow.session), lane_bottom(text, fast.session)
    assert "░" in slow_lane and "▓" in slow_lane and "▓" in fast_lane, text
    assert "░ queued" in text and ("▓ engine prefill" in text or "▓ prefill" in text), text
    # The slow session's last turn not yet done: its wait's cells stay blank, the earlier turns' split stays.
    open_turn = await lanes_at_end([e for e in rec.events if e is not slow], rec.header)
    before = lane_bottom(open_turn, slow.session)
    firsts = {(e.session, e.turn): e.t for e in rec.events if isinstance(e, ev.FirstToken)}
    first = firsts[(slow.session, last)]
    queued_from, queued_to = first - slow.engine_prefill_s - slow.queued_s, first - slow.engine_prefill_s
    k = rec.header.time_scale or 1.0  # the lanes' cells are modelled seconds; the recording's times wall clock
    queued_from, queued_to = queued_from * k, queued_to * k
    whole = range(math.ceil(queued_from), math.floor(queued_to))  # one-second cells wholly inside the queued part
    assert whole and all(slow_lane[i] == "░" and before[i] == " " for i in whole), (whole, before, slow_lane)


async def test_decode_lanes_without_engine_figures_draw_no_split():
    app, _ = replay_app(two_session_run())
    async with app.run_test(size=(120, 40)) as pilot:
        await show_at(pilot)
        text = app.query_one(TimelinePanel).plain_text()
    assert "░" not in text and "▓" not in text and "queued" not in text and "another session prefilling" in text
