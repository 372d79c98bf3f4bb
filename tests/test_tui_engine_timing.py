"""The engine's account of each turn and the client's check of itself, as the UI shows them (issue 19): the focus
screen's table takes a span or a client-busy mark that comes after its turn ended, the Server panel says in one
line when the engine times no turn and which flag would, and the header shows the client's lag while it is over
5 ms."""

from __future__ import annotations

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import panels
from rampwatch.drivers.run.recording import Recording
from rampwatch.tui.app import RampwatchApp
from rampwatch.tui.sources import ReplaySource
from rampwatch.tui.widgets.header import HeaderBar
from rampwatch.tui.widgets.server import ServerPanel
from tests.conftest import focus_cells, open_focus
from tests.test_state_analysis import header

UNTIMED = "engine's own queue and prefill time per turn unavailable (vLLM: --enable-per-request-metrics"


def one_turn(*, timed: bool) -> list[ev.AnyEvent]:
    """One session's one turn, sent at 1.0, first token at 3.0, done at 3.5; with or without vLLM's own figures."""
    engine = {"queued_s": 0.5, "engine_prefill_s": 1.4} if timed else {}
    return [
        ev.SessionPlanned(t=0.0, session="s1", schedule=[1000], salt="x"),
        ev.MetricsSample(t=0.5, source="e", engine="vllm", values={"kv_usage": 0.1, "running": 0.0}),
        ev.RequestSent(
            t=1.0, session="s1", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=4000, request_id="r-s1-t1"
        ),
        ev.FirstToken(t=3.0, session="s1", turn=1),
        ev.TokenTimes(t=3.5, session="s1", turn=1, times=[3.0, 3.25, 3.5]),
        ev.TurnDone(
            t=3.5, session="s1", turn=1, status="ok", prompt_tokens=1000, completion_tokens=3, chunks=3, **engine
        ),
        ev.MetricsSample(t=4.0, source="e", engine="vllm", values={"kv_usage": 0.1, "running": 0.0}),
    ]


def app_at_end(events: list[ev.AnyEvent]) -> tuple[RampwatchApp, ReplaySource]:
    src = ReplaySource(Recording(header=header(), events=events))
    src.seek(src.end_t)
    src.paused = True
    return RampwatchApp(src, autostart=False), src


async def test_the_focus_table_takes_a_span_and_a_busy_mark_after_the_turn():
    app, src = app_at_end(one_turn(timed=False))
    async with app.run_test(size=(200, 40)) as pilot:
        heads, rows = await open_focus(app, pilot)
        cells = rows[0]
        assert "queued s" not in heads and cells[heads.index("client")] == ""  # no engine figures, no busy mark yet
        # The turn's span arrives after its end (vLLM's exporter sends every few seconds), then a lag report
        # whose window covers one of the turn's stamps: both change a finished turn, and the table shows them.
        src.state.apply(ev.EngineSpan(t=5.0, request_id="r-s1-t1", queued_s=0.5, prefill_s=1.4, decode_s=0.5))
        heads, (cells,) = await focus_cells(app, pilot)
        assert "queued s" in heads, heads
        assert cells[heads.index("queued s")] == "0.50" and cells[heads.index("engine prefill s")] == "1.40"
        assert cells[heads.index("rest s")] == "0.10"
        src.state.apply(ev.ClientLag(t=5.5, p50_ms=0.1, p99_ms=30.0, max_ms=30.0, busy=[(3.2, 3.3)]))
        assert src.state.turns[0].client_busy
        heads, (cells,) = await focus_cells(app, pilot)
        assert "client" in heads and cells[heads.index("client")] == "busy", (heads, cells)


async def panel_text(events: list[ev.AnyEvent], panel: type) -> str:
    app, _ = app_at_end(events)
    async with app.run_test(size=(200, 50)) as pilot:
        app.redraw()
        await pilot.pause()
        return app.query_one(panel).plain_text()


async def test_the_server_panel_says_when_the_engine_times_no_turn_and_which_flag_would():
    text = " ".join((await panel_text(one_turn(timed=False), ServerPanel)).split())
    assert UNTIMED in text, text
    assert UNTIMED not in " ".join((await panel_text(one_turn(timed=True), ServerPanel)).split())
    assert UNTIMED not in " ".join((await panel_text(one_turn(timed=False)[:3], ServerPanel)).split())  # no turn yet


async def test_the_header_shows_the_clients_lag_while_it_is_over_5_ms():
    async def shown(lag_ms: float, at: float, own: list[bool] | None = None) -> str:
        busy = [(3.5, 3.6)] * len(own or [])
        lag = ev.ClientLag(t=4.0, p50_ms=0.1, p99_ms=lag_ms, max_ms=lag_ms, busy=busy, busy_own=own or [])
        events = [*one_turn(timed=True), lag]
        events.append(ev.MetricsSample(t=at, source="e", engine="vllm", values={"kv_usage": 0.1}))
        app, _ = app_at_end(events)
        async with app.run_test(size=(200, 40)) as pilot:
            app.redraw()
            await pilot.pause()
            return str(app.query_one(HeaderBar).shown)

    assert "client lag 12ms " in await shown(12.0, 5.0)  # the latest second's worst, 1 s ago
    assert "client lag 12ms (os)" in await shown(12.0, 5.0, own=[False, False])  # the machine woke it late
    assert "client lag 12ms " in await shown(12.0, 5.0, own=[False, True])  # and its own work held it too
    assert "client lag" not in await shown(4.0, 5.0)  # under the 5 ms bar
    assert "client lag" not in await shown(12.0, 9.0)  # 5 s ago: no longer now


def test_the_hint_waits_for_the_runs_end_while_spans_are_expected():
    """With --otlp the engine's figures come in spans seconds after each turn: telling the user to pass --otlp
    (or a server flag) before the run ended would be wrong; at its end, with no turn timed, it is said."""
    import msgspec

    from rampwatch.drivers.model.state import RunState

    state = RunState(msgspec.structs.replace(header(), spans_expected=True))
    for e in one_turn(timed=False):
        state.apply(e)
    assert not panels.engine_timing_missing(state)
    state.apply(ev.RunEnded(t=5.0, status="done", exit_code=0))
    assert panels.engine_timing_missing(state)
    plain = RunState(header())
    for e in one_turn(timed=False):
        plain.apply(e)
    assert panels.engine_timing_missing(plain)  # no spans to wait for: said as the turn ends
