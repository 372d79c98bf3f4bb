"""The client's check per driver worker (issue 36): each worker's loop reports its own lag, a late window marks
only the turns of that worker's sessions, the header names the worst worker, and the report gives each worker's
worst lag, CPU and busy turns. A run of one driver (and every older recording) reads as before."""

from __future__ import annotations

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.drivers.run.loop_lag import LoopLagMonitor
from rampwatch.tui.widgets.header import header_text


def planned(workers: dict[str, int | None]) -> RunState:
    """Sessions, each on its worker, with turn 1 sent at 0 and its first token at 0.5."""
    state = RunState()
    for sid, worker in workers.items():
        state.apply(ev.SessionPlanned(t=0.0, session=sid, schedule=[100], salt=sid, worker=worker))
        state.apply(ev.RequestSent(t=0.0, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
        state.apply(ev.FirstToken(t=0.5, session=sid, turn=1))
    return state


def stamps(state: RunState, sids: list[str]) -> None:
    for sid in sids:  # the same stamps on both: at 0.60, inside the window below
        state.apply(ev.TokenTimes(t=0.7, session=sid, turn=1, times=[0.60, 0.70]))


def late(worker: int | None, t: float = 1.0, max_ms: float = 40.0, own: bool = True, **kw) -> ev.ClientLag:
    """A lag report with one window, 0.59 to 0.65, the driver's own or the machine's."""
    kw = {"busy": [(0.59, 0.65)], "busy_own": [own], **kw}
    return ev.ClientLag(t=t, p50_ms=0.1, p99_ms=max_ms, max_ms=max_ms, worker=worker, **kw)


def busy(state: RunState) -> dict[str, bool]:
    return {sid: s.current.client_busy for sid, s in state.sessions.items()}


@pytest.mark.parametrize("lag_first", [False, True], ids=["stamps-then-lag", "lag-then-stamps"])
def test_a_workers_late_window_marks_only_its_own_turns(lag_first):
    """Two workers' sessions stamped at the same time: w1's late window marks w1's turn, not w0's, whichever of
    the stamps and the lag report came first."""
    state = planned({"a": 0, "b": 1})
    if lag_first:
        state.apply(late(1))
    stamps(state, ["a", "b"])
    if not lag_first:
        state.apply(late(1))
    assert busy(state) == {"a": False, "b": True}
    assert state.client.marked == 1 and state.client.workers[1].marked == 1
    state.apply(
        late(0, t=1.1, busy=[], busy_own=[])
    )  # w0's loop reports too, with no late window: nothing more is marked
    assert busy(state) == {"a": False, "b": True} and state.client.workers[0].marked == 0


@pytest.mark.parametrize("lag_first", [False, True], ids=["stamps-then-lag", "lag-then-stamps"])
def test_a_report_of_no_worker_marks_every_turn(lag_first):
    """One driver (every recording before workers): its window marks the turns of every session, whatever
    worker they name."""
    state = planned({"a": 0, "b": 1, "c": None})
    if lag_first:
        state.apply(late(None))
    stamps(state, ["a", "b", "c"])
    if not lag_first:
        state.apply(late(None))
    assert busy(state) == {"a": True, "b": True, "c": True}


def test_the_header_names_the_worst_worker():
    state = planned({"a": 0, "b": 3})
    state.apply(late(0, t=1.0, max_ms=8.0))
    state.apply(late(3, t=1.2, max_ms=12.0, own=False))  # the machine woke w3's loop late
    assert "client lag 12ms (w3, os)" in header_text(state, 1.5, "live", None).plain
    state.apply(late(3, t=2.2, max_ms=3.0))  # w3 is under the bar again: w0's 8 ms is still the latest of w0
    assert "client lag 8ms (w0)" in header_text(state, 2.5, "live", None).plain
    assert "client lag" not in header_text(state, 9.0, "live", None).plain  # no report is recent


def test_one_drivers_header_reads_as_before():
    state = planned({"a": None})
    state.apply(late(None, max_ms=12.0, own=False))
    assert " client lag 12ms (os) " in header_text(state, 1.5, "live", None).plain
    state.apply(late(None, t=2.0, max_ms=40.0))
    assert " client lag 40ms " in header_text(state, 2.5, "live", None).plain


def finish(state: RunState, sids: list[str]) -> None:
    for sid in sids:
        state.apply(ev.TurnDone(t=3.5, session=sid, turn=1, status="ok", completion_tokens=2, chunks=2))


def test_the_report_gives_each_workers_lag_cpu_and_busy_turns():
    state = planned({"a": 0, "b": 1})
    stamps(state, ["a", "b"])
    state.apply(late(1, t=1.0, max_ms=40.0, own_max_ms=12.5, cpu_s=0.9))
    for t, cpu in ((1.0, 0.6), (2.0, 0.7), (3.0, 0.8)):  # 2.1 s of CPU over 3 s: 70%, the peak 80%
        state.apply(ev.ClientLag(t=t, p50_ms=0.1, p99_ms=2.0, max_ms=8.1, worker=0, cpu_s=cpu, own_max_ms=1.5))
    # w1 next reports two seconds later (its loop held): 1.6 s of CPU over them is 80% of each, not a peak of 160%.
    state.apply(ev.ClientLag(t=3.0, p50_ms=0.1, p99_ms=2.0, max_ms=3.0, worker=1, cpu_s=1.6, own_max_ms=1.0))
    finish(state, ["a", "b"])
    rep = build_report(state)
    lines = summary_lines(rep)
    assert (
        "client w0: lag worst 8.1 ms (its own work 1.5 ms), CPU 70% (peak 80% of a second); "
        "0 turns client busy, 0 by its own work"
    ) in lines
    assert (
        "client w1: lag worst 40.0 ms (its own work 12.5 ms), CPU 83% (peak 90% of a second); "
        "1 turn client busy, 1 by its own work"
    ) in lines
    client = next(i for i, line in enumerate(lines) if line.startswith("client: "))
    assert lines[client].startswith("client: event-loop lag worst 40 ms")  # the run's worst, of any worker
    assert lines[client + 1].startswith("client w0: ") and lines[client + 2].startswith("client w1: ")
    by = {w.worker: w for w in rep.client_workers or []}
    assert by[0].cpu_s == pytest.approx(2.1) and by[0].cpu_share == pytest.approx(0.7)
    assert by[1].busy_turns == 1 and by[0].busy_turns == 0


def test_one_drivers_report_reads_as_before():
    """One driver: the `client:` line as before and no line per worker; its JSON still has its loop's figures."""
    state = planned({"a": None, "b": None})
    stamps(state, ["a"])
    state.apply(
        ev.ClientLag(
            t=1.0, p50_ms=0.1, p99_ms=2.0, max_ms=13.0, busy=[(0.59, 0.65)], busy_own=[False], own_max_ms=4.9, cpu_s=0.5
        )
    )
    finish(state, ["a", "b"])
    rep = build_report(state)
    lines = summary_lines(rep)
    assert [line for line in lines if line.startswith("client")] == [
        "client: event-loop lag worst 13 ms (its own work 4.9 ms at most, the rest the machine's); "
        "1 of 2 turns client busy, 0 by its own work (a stamp taken while it ran over 5 ms late)"
    ]
    (w,) = rep.client_workers or []
    assert w.worker is None and w.cpu_s == 0.5 and w.busy_turns == 1


def test_a_recording_without_lag_reports_has_no_client_workers():
    state = planned({"a": None})
    finish(state, ["a"])
    rep = build_report(state)
    assert rep.client_lag_max_ms is None and rep.client_workers is None


def test_the_monitor_stamps_its_worker_and_its_cpu():
    out: list[ev.AnyEvent] = []
    cpu = iter([10.0, 10.4, 11.0])  # at making it, then at each report
    m = LoopLagMonitor(out.append, lambda: 0.0, worker=2, cpu=lambda: next(cpu))
    m.tick(0.0, 0.001)
    m.flush(1.0)
    m.flush(1.5)  # nothing measured since: no report, and its CPU is the next report's
    m.tick(1.5, 1.501)
    m.flush(2.0)
    assert [(e.worker, round(e.cpu_s or 0, 9)) for e in out if isinstance(e, ev.ClientLag)] == [(2, 0.4), (2, 0.6)]
    one = LoopLagMonitor(out.append, lambda: 0.0)
    one.tick(0.0, 0.001)
    one.flush(1.0)
    assert out[-1].worker is None and out[-1].cpu_s is not None and out[-1].cpu_s >= 0
