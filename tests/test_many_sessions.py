"""The live view with many sessions: every panel keeps its place, the
Sessions table aggregates, scrolls, sorts, filters and opens a session."""

from __future__ import annotations

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import Recording
from rampwatch.tui.app import RampwatchApp
from rampwatch.tui.sources import ReplaySource
from rampwatch.tui.widgets.events import EventsPanel
from rampwatch.tui.widgets.focus import SessionScreen
from rampwatch.tui.widgets.gpus import GpuPanel
from rampwatch.tui.widgets.prefill import PrefillPanel
from rampwatch.tui.widgets.server import ServerPanel
from rampwatch.tui.widgets.sessions import SessionsTable
from rampwatch.tui.widgets.timeline import TimelinePanel
from tests.test_state_analysis import header, turn_ok

AT = 12.0  # the moment the tests look at


def many_sessions_run(n: int = 64) -> list[ev.AnyEvent]:
    """n sessions: turn 1 done by all but every fourth (never started: queued);
    at AT, turn 2 is prefilling for a third of them and decoding for others."""
    out: list[ev.AnyEvent] = [
        ev.MetricsSample(
            t=0.1,
            source="m",
            engine="vllm",
            values={
                "kv_usage": 0.3,
                "running": 40,
                "waiting": 6,
                "prefix_queries": 0,
                "prefix_hits": 0,
                "generation_tokens": 0,
            },
        )
    ]
    for k in range(1, n + 1):
        sid = f"s{k}"
        out.append(ev.SessionPlanned(t=0.0, session=sid, schedule=[1000, 2000, 4000], salt=sid))
        if k % 4 == 0:
            continue  # queued: never sent
        sent, first = 0.05 * k, 0.05 * k + 1.0 + 0.3 * (k % 7)
        times = [first + 0.05 * i for i in range(20)]
        out += [
            ev.RequestSent(t=sent, session=sid, turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=4000),
            ev.FirstToken(t=first, session=sid, turn=1),
            ev.TokenTimes(t=times[-1], session=sid, turn=1, times=times),
            turn_ok(8.0 + 0.01 * k, sid, 1, prompt_tokens=1000, cached_tokens=0, tokens=20, needle=k % 9 != 0),
        ]
        if k % 4 == 3:
            continue  # idle after turn 1
        sent2 = 9.0 + 0.02 * k
        out.append(
            ev.RequestSent(t=sent2, session=sid, turn=2, target_tokens=2000, new_tokens_est=1000, body_bytes=8000)
        )
        if k % 4 == 1:  # decoding at AT, its last token a little before
            first2 = sent2 + 0.5
            times2 = [first2 + 0.1 * i for i in range(10)]
            out += [
                ev.FirstToken(t=first2, session=sid, turn=2),
                ev.TokenTimes(t=times2[-1], session=sid, turn=2, times=times2),
            ]
    return sorted(out, key=lambda e: e.t)


def app_at(n: int = 64) -> tuple[RampwatchApp, ReplaySource]:
    src = ReplaySource(Recording(header=header(), events=many_sessions_run(n)))
    src.seek(AT)
    src.paused = True
    return RampwatchApp(src, autostart=False), src


async def show(app: RampwatchApp, pilot) -> None:  # noqa: ANN001
    app.redraw()
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40), (200, 60)])
async def test_every_panel_keeps_its_place_at_64_sessions(size):
    app, _ = app_at()
    async with app.run_test(size=size) as pilot:
        await show(app, pilot)
        await show(app, pilot)  # the second tick: heights set by the first are laid out
        width, height = size
        for kind in (SessionsTable, PrefillPanel, TimelinePanel, ServerPanel, GpuPanel, EventsPanel):
            region = app.query_one(kind).region
            assert region.height >= 2 and region.bottom <= height - 1, (kind.__name__, region)
        table = app.query_one(SessionsTable)
        lines = table.lines_text()
        assert "64 sessions · 16 decoding · 16 prefilling · 16 queued · 16 idle" in " ".join(lines)
        assert "TTFT p50" in " ".join(lines) and "tok/s p50" in " ".join(lines)
        prefill = app.query_one(PrefillPanel).plain_text()
        assert "more prefilling" in prefill
        timeline = app.query_one(TimelinePanel).plain_text()
        assert "p50" in timeline and "min" in timeline


async def test_sort_cycles_and_puts_the_interesting_sessions_first():
    app, _ = app_at()
    async with app.run_test(size=(120, 40)) as pilot:
        await show(app, pilot)
        table = app.query_one(SessionsTable)
        assert [s.id for s in table.rows[:3]] == ["s1", "s2", "s3"]
        await pilot.press("s")
        assert table.sort_name == "state" and table.rows[0].state == "prefilling"
        assert "by state" in table.border_title
        await pilot.press("s")
        ttfts = [s.last_done.ttft for s in table.rows if s.last_done is not None]
        assert table.sort_name == "TTFT" and ttfts == sorted(ttfts, reverse=True)
        await pilot.press("s", "s", "s")
        assert table.sort_name == "id"


async def test_filter_keeps_matching_rows_and_empty_clears():
    app, _ = app_at()
    async with app.run_test(size=(120, 40)) as pilot:
        await show(app, pilot)
        table = app.query_one(SessionsTable)
        await pilot.press("slash")
        await pilot.press(*"prefilling", "enter")
        await show(app, pilot)
        assert len(table.rows) == 16 and all(s.state == "prefilling" for s in table.rows)
        assert "filter 'prefilling' (16/64)" in table.border_title
        await pilot.press("slash", *["backspace"] * 12, "enter")
        await show(app, pilot)
        assert len(table.rows) == 64


async def test_a_trace_s_finished_sessions_are_counted_not_listed():
    """A trace run (thousands of sessions, most of them finished at any time): the rows are the live sessions,
    the finished ones a count in the aggregate line and the title; the filter `done` lists them."""
    events = many_sessions_run()
    for e in events:
        if isinstance(e, ev.SessionPlanned) and int(e.session[1:]) % 4 == 3:
            e.schedule = [1000]  # one turn, done: the sessions left idle after turn 1 finish instead
    traced = header()
    traced.trace = ev.TraceRun(path="agents.jsonl", format="agentic", block_size=64)
    src = ReplaySource(Recording(header=traced, events=events))
    src.seek(AT)
    src.paused = True
    app = RampwatchApp(src, autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await show(app, pilot)
        table = app.query_one(SessionsTable)
        assert len(table.rows) == 48 and all(s.state != "done" for s in table.rows)
        assert "16 done" in " ".join(table.lines_text()) and "16 done, not listed" in table.border_title
        await pilot.press("slash", *"done", "enter")
        await show(app, pilot)
        assert len(table.rows) == 16 and all(s.state == "done" for s in table.rows)


async def test_cursor_scrolls_and_enter_opens_the_session_then_escape_returns():
    app, _ = app_at()
    async with app.run_test(size=(120, 40)) as pilot:
        await show(app, pilot)
        table = app.query_one(SessionsTable)
        await pilot.press(*["down"] * 20)
        assert table.cursor == "s21" and table.scroll_offset.y > 0  # the cursor stays on screen
        assert any(line.strip().startswith("s21") for line in table.lines_text())
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen) and app.screen.session == "s21"
        await show(app, pilot)
        assert app.screen.query_one("DataTable").row_count == 1  # turn 1 done; turn 2 decoding
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SessionScreen)


async def test_turns_finishing_in_the_same_second_collapse_in_the_events():
    app, _ = app_at()
    async with app.run_test(size=(120, 40)) as pilot:
        await show(app, pilot)
        events = app.query_one(EventsPanel).plain_text()
        assert "48 turns done: TTFT" in events  # all turn-1s finished within second 8


async def test_256_sessions_stay_bounded_and_answer_keys():
    app, _ = app_at(256)
    async with app.run_test(size=(120, 40)) as pilot:
        await show(app, pilot)
        table = app.query_one(SessionsTable)
        assert table.region.height < 20
        await pilot.press("end" if False else "pagedown")
        assert table.cursor == "s11"


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
def test_64_session_snapshot(snap_compare, size):
    app, _ = app_at()

    async def settle(pilot) -> None:  # noqa: ANN001
        await show(app, pilot)
        await show(app, pilot)

    assert snap_compare(app, terminal_size=size, run_before=settle)
