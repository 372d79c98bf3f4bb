"""Open-loop arrivals (issue 22): seeded Poisson starts, --max-live, latency from the due time (coordinated
omission) with late turns flagged, per-turn SLO verdicts and goodput, and bad values refused."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import panels
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.goodput import per_min
from rampwatch.drivers.run.arrivals import ArrivingSession, arrival_times, parse_rate
from rampwatch.drivers.run.config import BadInput, RunConfig
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.profiles import make_profile
from tests.conftest import report_json, rw, small_run
from tests.folding import fold, sample
from tests.simhost import ThreadedSim

STALL_S = 2.0


@pytest.mark.parametrize(
    ("text", "per_s"),
    [("0.5/s", 0.5), ("30/h", 30 / 3600), ("2/min", 2 / 60), ("2", 2 / 60), (" 1.5 / sec ", 1.5), (".5/m", 0.5 / 60)],
)
def test_a_rate_reads_as_conversations_per_second(text, per_s):
    assert parse_rate(text) == pytest.approx(per_s)


@pytest.mark.parametrize(
    ("text", "why"),
    [("0", "above zero"), ("0/s", "above zero"), ("fast", "not a rate"), ("2/day", "not a rate"), ("", "not a rate")],
)
def test_a_bad_rate_says_why(text, why):
    with pytest.raises(BadInput, match=why):
        parse_rate(text)


@pytest.mark.parametrize(
    "flags",
    [
        ["--arrivals", "0"],
        ["--arrivals", "fast"],
        ["--slo", "ttft="],
        ["--slo", "foo=1s"],
        ["--arrivals", "2/min", "--lockstep"],
        ["--max-live", "2"],
        ["--slo", "ttft=1s", "--warmup", "soon"],
        ["--warmup", "60s"],
    ],
)
def test_bad_open_loop_values_get_one_line_and_exit_2(flags):
    out = rw(*small_run("http://127.0.0.1:9", "--no-record", *flags))
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert any(f in lines[0] for f in flags if f.startswith("--")), lines[0]


def test_seeded_arrivals_start_the_sessions_at_their_times_until_the_time_limit(tmp_path):
    """120/min with seed 5: the sessions whose drawn arrival comes before the 4 s limit start, each planned
    at its drawn time after the drive's start (within the loop's tolerance), turn 1 due then; the later ones
    never start."""
    rate, seed, limit = 2.0, 5, 4.0
    times = arrival_times(rate, 12, seed)
    record = tmp_path / "arrivals.jsonl"
    with ThreadedSim(make_profile("tiny")) as sim:
        args = ["--arrivals", "120/min", "--seed", str(seed), "--sessions", "12", "--time-limit", "4s"]
        out = rw(*small_run(sim.url, "--record", str(record), *args, schedule="1k,2k"))
    assert out.returncode == 0, out.stderr
    events = list(read_recording(record).events)
    planned = [e for e in events if isinstance(e, ev.SessionPlanned)]
    begun = planned[0].arrival - times[0]  # the arrivals count from the drive's start, after probe and calibration
    assert 0 < begun < 2.0
    expected = [begun + t for t in times if begun + t < limit]
    assert 0 < len(expected) < 12  # the seed is chosen so the limit cuts the arrivals
    assert [p.session for p in planned] == [f"s{k}" for k in range(1, len(expected) + 1)]
    assert [p.arrival for p in planned] == pytest.approx(expected, abs=1e-9)
    for p in planned:
        assert p.arrival <= p.t < p.arrival + 0.3, (p.session, p.arrival, p.t)
    firsts = {e.session: e for e in events if isinstance(e, ev.RequestSent) and e.turn == 1}
    assert {sid: e.due for sid, e in firsts.items()} == {p.session: p.arrival for p in planned}
    rep = report_json(record)
    assert rep["open_loop"]["arrived"] == len(expected) and rep["open_loop"]["seed"] == seed


def test_max_live_holds_and_a_waiting_arrival_is_late_by_its_wait(tmp_path):
    """Three conversations arriving within a second, at most one live: they run one after the other, and a
    later one's turn 1 is due at its arrival, sent after the one before ended."""
    record = tmp_path / "live.jsonl"
    with ThreadedSim(make_profile("tiny")) as sim:
        args = ["--arrivals", "10/s", "--seed", "1", "--sessions", "3", "--max-live", "1"]
        out = rw(*small_run(sim.url, "--record", str(record), *args, schedule="1k,2k,4k", output_tokens=32))
    assert out.returncode == 0, out.stderr
    events = list(read_recording(record).events)
    spans: dict[str, list[float]] = {}
    for e in events:
        if isinstance(e, (ev.RequestSent, ev.TurnDone)):
            spans.setdefault(e.session, []).append(e.t)
    runs = sorted((min(ts), max(ts)) for ts in spans.values())
    assert len(runs) == 3
    for (_, end), (start, _) in zip(runs, runs[1:]):
        assert start >= end  # never two live at once
    rep = report_json(record)
    for s in rep["sessions"][1:]:
        first = s["turns"][0]
        assert first["late"] and first["send_lag_s"] == pytest.approx(first["sent_s"] - first["due_s"])
        assert first["ttft_from_due_s"] == pytest.approx(first["ttft_s"] + first["send_lag_s"])


@pytest.mark.serial  # a 2 s stall timed to 0.3 s
def test_a_stalled_client_marks_the_late_turns_and_slo_and_goodput_follow_the_recording(monkeypatch):
    """The driver's loop is held for 2 s from just before s1 arrives (its first prompt already built, as every
    conversation's is ahead of its arrival): the turns due meanwhile are sent late by what was left
    of the stall, flagged late, and their TTFT from the due time exceeds that from the send time by exactly
    the lag (about the stall for s1's first turn). The SLO (ttft=1s) verdicts and goodput match figures
    worked out by hand from the recorded events."""
    with ThreadedSim(make_profile("tiny")) as sim:
        cfg = RunConfig(
            url=sim.url,
            gpu="none",
            metrics_urls=[],
            schedule=[1024, 2048],
            sessions=3,
            output_tokens=16,
            arrivals_per_s=1.0,
            seed=11,
            slo="ttft=1s",
        )
        run = Run(cfg, record=False, keep_events=True)
        stalls: list[tuple[float, float]] = []

        def stall() -> None:
            start = run.clock()
            time.sleep(STALL_S)
            stalls.append((start, run.clock()))

        prepare = ArrivingSession.prepare

        async def prepare_then_stall_at_the_arrival(self: ArrivingSession) -> None:
            await prepare(self)
            if self.runner.sid == "s1":  # a moment before s1 is due, so its turn 1 waits the whole stall
                assert self.runner.arrival is not None
                asyncio.get_running_loop().call_later(self.runner.arrival - run.clock() - 0.005, stall)

        monkeypatch.setattr(ArrivingSession, "prepare", prepare_then_stall_at_the_arrival)

        async def main() -> int:
            await run.prepare()
            return await run.drive()

        assert asyncio.run(main()) == 0
    ((stall_start, stall_end),) = stalls
    events = run.hub.events
    sent = {(e.session, e.turn): e for e in events if isinstance(e, ev.RequestSent)}
    first = {(e.session, e.turn): e.t for e in events if isinstance(e, ev.FirstToken)}
    assert all(e.due is not None for e in sent.values())
    rep = build_report(run.state)
    rows = {(s.id, r.turn): r for s in rep.sessions for r in s.turns}
    assert len(rows) == 6
    for key, row in rows.items():
        e = sent[key]
        lag = e.t - e.due
        assert row.due_s == e.due and row.sent_s == e.t and row.late == (lag > 0.010)
        assert row.ttft_from_due_s == pytest.approx(row.ttft_s + lag)
        if e.due < stall_end - 0.05:  # due while the loop was held: sent only after it
            assert row.late and lag >= stall_end - e.due - 0.01
        # The verdict by hand: finished, and the first token within 1 s of the due time.
        assert row.slo_met == (first[key] - e.due <= 1.0)
    s1 = rows[("s1", 1)]
    assert s1.ttft_from_due_s - s1.ttft_s == pytest.approx(STALL_S, abs=0.3)
    assert s1.slo_met is False
    met = [k for k, r in rows.items() if r.slo_met]
    g = rep.goodput
    assert g is not None and g.turns_met == len(met) and g.turns == 6
    assert g.conversations_met == sum(all(rows[(s, t)].slo_met for t in (1, 2)) for s in ("s1", "s2", "s3"))
    assert g.turns_met_per_min == pytest.approx(len(met) / (run.state.ended.t / 60))
    assert rep.open_loop is not None and rep.open_loop.late_turns == sum(1 for r in rows.values() if r.late)
    # The live tally (the header's) agrees with the report, and the window share is of the last 5 minutes' turns.
    assert (run.state.goodput.met, run.state.goodput.judged) == (g.turns_met, 6)
    assert run.state.goodput.window_share(run.state.t) == pytest.approx(g.turns_met / 6)
    assert run.state.goodput.window_share(run.state.t + 301) is None
    # The Prometheus exporter, reading a fold of the same events, counts the same late turns and turns meeting it.
    _, exporter = fold(run.state.header, events)

    def total(name: str) -> float:
        return sum(sample(exporter, name, s) for s in ("s1", "s2", "s3"))

    assert total("rampwatch_late_turns_total") == rep.open_loop.late_turns
    assert total("rampwatch_slo_met_turns_total") == g.turns_met
    assert total("rampwatch_slo_met_conversations") == g.conversations_met  # every conversation finished
    # The header's tally counts the same conversations, and both rates over the run so far.
    assert len(run.state.goodput.conversations) == g.conversations_met
    assert per_min(g.turns_met, run.state.steady.minutes(run.state.ended.t)) == pytest.approx(g.turns_met_per_min)
    # --warmup 1: the first arrival (s1, the stalled one) is left out, and the time before s2's first due turn.
    warm_state, _ = fold(msgspec.structs.replace(run.state.header, warmup="1"), events)
    warm = build_report(warm_state).goodput
    kept = [k for k in rows if k[0] != "s1"]
    start = min(sent[k].due for k in kept)
    assert warm is not None and warm.warmup_turns == 2 and warm.turns == 4 and warm.conversations == 2
    assert warm.turns_met == sum(rows[k].slo_met for k in kept)
    assert warm.minutes == pytest.approx((run.state.ended.t - start) / 60)


# (session, turn, due, first token, done): ttft=1s from the due time; None: still streaming at the time limit.
CUT_OFF_TURNS = [
    ("s1", 1, 0.0, 0.5, 1.0),  # s1, both turns met, is --warmup 1's: left out
    ("s1", 2, 2.0, 2.5, 3.0),
    ("s2", 1, 5.0, 5.5, 20.0),  # the earliest due turn kept, though s3's and s4's finish first
    ("s2", 2, 21.0, 21.5, 22.0),  # s2's third planned turn never starts: the time limit cut it off
    ("s3", 1, 8.0, 8.5, 9.0),  # the first kept turn to finish
    ("s4", 1, 10.0, 10.5, 11.0),  # met, then ...
    ("s4", 2, 12.0, 15.0, 16.0),  # ... missed (3 s): s4 is taken back out
    ("s5", 1, 12.0, 12.5, 14.0),
    ("s5", 2, 25.0, 25.5, None),  # running at the limit: not a finished turn
]
CUT_OFF_PLANNED = {"s1": 2, "s2": 3, "s3": 1, "s4": 2, "s5": 2}
CUT_OFF_END = 30.0


def cut_off_run() -> tuple[ev.Header, list[ev.AnyEvent]]:
    """CUT_OFF_TURNS as a recording's header (--slo ttft=1s --warmup 1) and events, in time order."""
    header = ev.Header(
        rampwatch_version="t", command=[], mode="run", server="x", arrivals_per_s=0.2, slo="ttft=1s", warmup="1"
    )
    events: list[ev.AnyEvent] = []
    for sid, n in CUT_OFF_PLANNED.items():
        at = next(due for s, turn, due, *_ in CUT_OFF_TURNS if s == sid and turn == 1)
        events.append(ev.SessionPlanned(t=at, session=sid, schedule=[100] * n, salt=sid, arrival=at))
    for sid, turn, due, first, done in CUT_OFF_TURNS:
        events += [
            ev.RequestSent(t=due, session=sid, turn=turn, target_tokens=100, new_tokens_est=100, body_bytes=1, due=due),
            ev.FirstToken(t=first, session=sid, turn=turn),
        ]
        if done is not None:
            events.append(ev.TurnDone(t=done, session=sid, turn=turn, status="ok", completion_tokens=2, chunks=2))
    events.append(ev.RunEnded(t=CUT_OFF_END, status="time-limit", exit_code=0))
    events.sort(key=lambda e: e.t)
    return header, events


def test_conversations_met_is_one_figure_in_the_report_the_header_and_the_exporter():
    """--warmup 1 and a time limit that cuts s2 and s5 off mid-ramp: the conversations met are s2, s3 and s5
    (every turn they finished met ttft=1s; s1 is the warmup's, s4 missed its second turn). The report, the live
    tally and the exporter (which used to count s1, ignoring the warmup, and only conversations that reached
    their last planned turn: s1 and s3) all say 3, and the exporter's s4 went 1 then back to 0. The live window
    starts where the report's does, at the earliest due turn kept (s2's at 5 s), not at the first to finish."""
    header, events = cut_off_run()
    s4_levels = []

    def s4_level(_state: object, exporter: object, e: ev.AnyEvent) -> None:
        if isinstance(e, ev.TurnDone) and e.session == "s4":
            s4_levels.append(sample(exporter, "rampwatch_slo_met_conversations", "s4"))

    state, exporter = fold(header, events, after=s4_level)
    g = build_report(state).goodput
    assert g is not None and (g.conversations_met, g.conversations) == (3, 4)
    assert len(state.goodput.conversations) == 3
    assert sum(sample(exporter, "rampwatch_slo_met_conversations", s) for s in CUT_OFF_PLANNED) == 3
    assert s4_levels == [1.0, 0.0]
    assert g.minutes == pytest.approx((CUT_OFF_END - 5.0) / 60)
    minutes = state.steady.minutes(CUT_OFF_END)
    assert per_min(g.conversations_met, minutes) == pytest.approx(g.conversations_met_per_min)
    assert per_min(g.turns_met, minutes) == pytest.approx(g.turns_met_per_min)


def test_the_sessions_line_counts_arrived_live_and_waiting():
    from rampwatch.drivers.model.state import RunState
    from rampwatch.tui.widgets.sessions import aggregate_lines

    state = RunState()
    for k, sid in enumerate(("s1", "s2", "s3")):
        state.apply(ev.SessionPlanned(t=k, session=sid, schedule=[100], salt=sid, arrival=float(k)))
    for sid in ("s1", "s2"):
        state.apply(ev.RequestSent(t=3.0, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.TurnDone(t=4.0, session="s1", turn=1, status="ok"))
    assert panels.aggregate(state).arrivals == (3, 1, 1)
    assert "arrived 3 · live 1 · waiting 1" in aggregate_lines(state, 200)[0].plain
    closed = RunState()
    closed.apply(ev.SessionPlanned(t=0, session="s1", schedule=[100], salt="s1"))
    assert panels.aggregate(closed).arrivals is None and "arrived" not in aggregate_lines(closed, 200)[0].plain


def test_headless_progress_says_arrived_live_and_waiting():
    import io

    from rampwatch.drivers.model.state import RunState
    from rampwatch.tui.headless_lines import PROGRESS_EVERY_S, HeadlessPrinter

    state, out = RunState(), io.StringIO()
    state.apply(ev.SessionPlanned(t=1.0, session="s1", schedule=[100], salt="s1", arrival=1.0))
    HeadlessPrinter(state, out).progress(PROGRESS_EVERY_S)
    assert "arrived 1 · live 0 · waiting 1" in out.getvalue()


def test_compare_shows_each_runs_goodput(tmp_path):
    """Two recordings of the same open-loop run judged by different SLOs: compare gives each its goodput,
    equal to its own report's."""
    with ThreadedSim(make_profile("tiny")) as sim:
        for name, slo in (("loose", "ttft=60s"), ("tight", "ttft=1ms")):
            args = ["--arrivals", "10/s", "--seed", "2", "--sessions", "2", "--slo", slo]
            out = rw(*small_run(sim.url, "--record", str(tmp_path / f"{name}.jsonl"), *args, schedule="1k"))
            assert out.returncode == 0, out.stderr
    paths = [str(tmp_path / f"{n}.jsonl") for n in ("loose", "tight")]
    import json

    cmp = json.loads(rw("compare", *paths, "--format", "json").stdout)
    reports = [report_json(tmp_path / f"{n}.jsonl") for n in ("loose", "tight")]
    for row, rep in zip(cmp["runs"], reports, strict=True):
        assert row["slo_turns_met"] == rep["goodput"]["turns_met"]
        assert row["late_turns"] == rep["open_loop"]["late_turns"]
        assert row["slo_conversations_met"] == rep["goodput"]["conversations_met"]
        assert row["slo_conversations_met_per_min"] == rep["goodput"]["conversations_met_per_min"]
    assert [r["slo_turns_met"] for r in cmp["runs"]] == [2, 0]
    assert [r["slo_conversations_met"] for r in cmp["runs"]] == [2, 0]
    table = rw("compare", *paths).stdout
    loose = cmp["runs"][0]["slo_conversations_met_per_min"]
    assert "goodput" in table and "SLO ttft=60s" in table
    assert f"2 conversations met it on every turn, {loose:.2f}/min" in table
    assert "0 conversations met it on every turn, 0.00/min" in table
