"""--slo per-turn verdicts and goodput (issue 22): the bounds as parsed, each bound judged at its edge, and a
closed-loop run against the simulated engine whose verdicts, goodput and --warmup are worked out by hand from
its recording."""

from __future__ import annotations

import msgspec
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import panels
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.slo import GOODPUT_WINDOW_S, GoodputTally, meets, parse_slo
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turns import TurnRecord
from rampwatch.drivers.model.warmup import parse_warmup
from rampwatch.drivers.model.workers import LOST
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.profiles import make_profile
from tests.conftest import focus_table, report_json, rw, small_run
from tests.simhost import ThreadedSim


def test_bounds_parse_to_seconds_and_bad_ones_say_why():
    s = parse_slo("ttft=90s, answer=1.5m,gap=1s,tpot=100ms")
    assert (s.ttft_s, s.answer_s, s.gap_s, s.tpot_s, s.ttft_per_token_s) == (90.0, 90.0, 1.0, 0.1, None)
    assert parse_slo("ttft=0.7ms/token").ttft_per_token_s == pytest.approx(0.0007)
    for bad, why in [
        ("ttft=", "not a time"),
        ("foo=1s", "not a bound"),
        ("gap=1ms/token", "only ttft"),
        ("ttft=1s,ttft=0.5ms/token", "twice"),
        ("tpot=0ms", "above zero"),
        ("ttft=1", "not a time"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_slo(bad)
    assert parse_warmup("60s").seconds == 60 and parse_warmup("3").conversations == 3
    with pytest.raises(ValueError):
        parse_warmup("0")


def finished_turn(**fields) -> TurnRecord:
    """A turn sent at 10 s whose first token came at 12 s, 11 tokens ending at 13 s, worst gap 0.3 s."""
    base = dict(session="s1", turn=1, target=1000, new_tokens_est=1000, sent_t=10.0, first_t=12.0, last_t=13.0)
    base |= dict(status="ok", completion_tokens=11, prompt_tokens=1000, answer_t=12.5, max_gap=0.3)
    return TurnRecord(**(base | fields))


@pytest.mark.parametrize(
    "slo, met",
    [
        ("ttft=2s", True),  # 12 - 10
        ("ttft=1.9s", False),
        ("ttft=2ms/token", True),  # 1000 new tokens: 2 s
        ("ttft=1.9ms/token", False),
        ("answer=2.5s", True),  # 12.5 - 10
        ("answer=2.4s", False),
        ("gap=300ms", True),
        ("gap=299ms", False),
        ("tpot=100ms", True),  # (13 - 12) / (11 - 1)
        ("tpot=99ms", False),
        ("ttft=2s,gap=299ms", False),  # every bound must hold
    ],
)
def test_each_bound_is_judged_at_its_edge(slo, met):
    assert meets(parse_slo(slo), finished_turn()) is met


def test_latency_counts_from_the_due_time_and_a_failed_turn_never_meets():
    slo = parse_slo("ttft=2s,answer=2.5s")
    assert meets(slo, finished_turn(due_t=10.0))
    assert not meets(slo, finished_turn(due_t=9.5))  # sent 0.5 s late: the user waited 2.5 s for the first token
    assert not meets(slo, finished_turn(status="failed"))
    assert not meets(slo, finished_turn(first_t=None))


def by_hand(events: list, ttft_bound: float) -> dict[tuple[str, int], bool]:
    """Each turn's verdict for ttft=BOUND, from the recorded events alone: finished ok, first token within the
    bound of the send (a closed loop has no due time)."""
    sent = {(e.session, e.turn): e.t for e in events if isinstance(e, ev.RequestSent)}
    first = {(e.session, e.turn): e.t for e in events if isinstance(e, ev.FirstToken)}
    ok = {(e.session, e.turn) for e in events if isinstance(e, ev.TurnDone) and e.status == "ok"}
    return {k: k in ok and k in first and first[k] - t <= ttft_bound for k, t in sent.items()}


def test_a_closed_loop_run_gets_verdicts_goodput_and_warmup_as_worked_out_from_its_recording(tmp_path):
    """Two lockstep sessions over 1k..8k: the recorded SLO (ttft=30s) is met by every turn; judged again
    against a bound between the fastest and slowest TTFT, the verdicts, the goodput per minute and a warmup
    match what the events say."""
    record = tmp_path / "slo.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=4.0)) as sim:
        args = ["--sessions", "2", "--lockstep", "--slo", "ttft=30s"]
        out = rw(*small_run(sim.url, "--record", str(record), *args, schedule="1k,2k,4k,8k", output_tokens=16))
    assert out.returncode == 0, out.stderr
    assert "goodput (SLO ttft=30s): 8 of 8 turns met it" in out.stdout
    rep = report_json(record)
    assert rep["run"]["schema"] == 11 and rep["open_loop"] is None
    assert all(t["slo_met"] is True and t["due_s"] is None for s in rep["sessions"] for t in s["turns"])
    g = rep["goodput"]
    assert (g["turns_met"], g["turns"], g["conversations_met"], g["conversations"]) == (8, 8, 2, 2)

    recording = read_recording(record)
    events = recording.events
    sent = {(e.session, e.turn): e.t for e in events if isinstance(e, ev.RequestSent)}
    first = {(e.session, e.turn): e.t for e in events if isinstance(e, ev.FirstToken)}
    ttfts = sorted(first[k] - sent[k] for k in sent)
    assert ttfts[0] < ttfts[-1]
    bound = (ttfts[0] + ttfts[-1]) / 2
    expected = by_hand(events, bound)
    assert 0 < sum(expected.values()) < len(expected)  # the bound splits the turns

    state = refold(recording.header, events, slo=f"ttft={bound * 1000:.3f}ms")
    rep2 = build_report(state)
    verdicts = {(s.id, r.turn): r.slo_met for s in rep2.sessions for r in s.turns}
    assert verdicts == expected
    g2, end = rep2.goodput, state.ended.t
    met = sum(expected.values())
    assert g2 is not None and g2.turns_met == met and g2.turns == 8
    assert g2.conversations_met == sum(all(expected[(s, t)] for t in range(1, 5)) for s in ("s1", "s2"))
    assert g2.turns_met_per_min == pytest.approx(met / (end / 60))

    # --warmup between the 4th and 5th send: the first four turns are left out, and so are the conversations
    # they began (both: lockstep).
    times = sorted(sent.values())
    warmup_s = (times[3] + times[4]) / 2
    state = refold(state.header, events, warmup=f"{warmup_s * 1000:.3f}ms")
    g3 = build_report(state).goodput
    kept = [k for k, t in sent.items() if t >= warmup_s]
    assert len(kept) == 4
    assert g3 is not None and g3.warmup_turns == 8 - len(kept) and g3.turns == len(kept)
    assert g3.turns_met == sum(expected[k] for k in kept) and g3.conversations == 0
    assert g3.minutes == pytest.approx((end - warmup_s) / 60, rel=1e-4)


def refold(header: ev.Header, events: list[ev.AnyEvent], **changes: str) -> RunState:
    """The events folded again under a header with `changes` (another --slo or --warmup): the fold judges each turn
    by the run's header, once."""
    state = RunState(msgspec.structs.replace(header, **changes))
    for e in events:
        state.apply(e)
    return state


def late_then_on_time() -> list[ev.AnyEvent]:
    """One open-loop conversation: turn 1 due at 1 s, sent at 2.5 s; turn 2 due and sent at 3 s; each first
    token 0.2 s after its send."""
    events: list[ev.AnyEvent] = [ev.SessionPlanned(t=1.0, session="s1", schedule=[100, 200], salt="a", arrival=1.0)]
    for turn, due, sent in ((1, 1.0, 2.5), (2, 3.0, 3.0)):
        events += [
            ev.RequestSent(
                t=sent, session="s1", turn=turn, target_tokens=100, new_tokens_est=100, body_bytes=1, due=due
            ),
            ev.FirstToken(t=sent + 0.2, session="s1", turn=turn),
            ev.TurnDone(t=sent + 0.4, session="s1", turn=turn, status="ok", completion_tokens=2, chunks=2),
        ]
    return events


def test_the_turn_table_shows_late_sends_and_verdicts_where_a_run_has_them():
    """An open-loop turn sent 1.5 s after it was due misses ttft=1s though its first token came 0.2 s after the
    send; the next, sent on time, meets it. The table (and the focus screen's, from the same columns) says so;
    a closed loop without --slo shows neither column."""
    from rampwatch.drivers.present.report import render

    header = ev.Header(rampwatch_version="t", command=[], mode="run", server="x", arrivals_per_s=1.0, slo="ttft=1s")
    state = RunState(header)
    for e in late_then_on_time():
        state.apply(e)
    md = render(build_report(state), "md")
    head = next(line for line in md.splitlines() if line.startswith("| turn"))
    heads = [h.strip() for h in head.strip("|").split("|")]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in md.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 2 ")
    ]
    late, slo = heads.index("late ms"), heads.index("SLO")
    assert [(r[late], r[slo]) for r in rows] == [("1500", "MISS"), ("", "met")]
    closed = RunState(ev.Header(rampwatch_version="t", command=[], mode="run", server="x"))
    closed.apply(ev.SessionPlanned(t=0, session="s1", schedule=[100], salt="a"))
    closed.apply(ev.RequestSent(t=0.1, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    closed.apply(ev.TurnDone(t=0.4, session="s1", turn=1, status="ok", completion_tokens=2, chunks=2))
    plain = render(build_report(closed), "md")
    assert "late ms" not in plain and "| SLO" not in plain


async def test_the_focus_screen_shows_the_late_send_and_the_verdicts():
    from rampwatch.drivers.run.recording import Recording
    from rampwatch.tui.sources import ReplaySource

    header = ev.Header(rampwatch_version="t", command=[], mode="run", server="x", arrivals_per_s=1.0, slo="ttft=1s")
    heads, cells = await focus_table(ReplaySource(Recording(header=header, events=late_then_on_time())), (200, 40))
    late, slo = heads.index("late ms"), heads.index("SLO")
    assert [(r[late], r[slo]) for r in cells] == [("1500", "MISS"), ("", "met")]


async def test_a_hand_edited_slo_that_no_longer_reads_leaves_the_verdicts_out_everywhere():
    """A recording whose --slo was edited into nonsense: the report goes without verdicts, and so does the session
    screen, which opens (it reads the fold's verdicts; it used to parse the SLO again, unguarded, and crash)."""
    from rampwatch.drivers.run.recording import Recording
    from rampwatch.tui.sources import ReplaySource

    header = ev.Header(rampwatch_version="t", command=[], mode="run", server="x", arrivals_per_s=1.0, slo="ttft=soon")
    state = RunState(header)
    for e in late_then_on_time():
        state.apply(e)
    rep = build_report(state)
    assert rep.goodput is None and all(t.slo_met is None for t in rep.sessions[0].turns)
    heads, cells = await focus_table(ReplaySource(Recording(header=header, events=late_then_on_time())), (200, 40))
    assert "SLO" not in heads and len(cells) == 2


def test_an_arrival_the_time_limit_kept_waiting_is_no_conversation_of_the_goodput(tmp_path):
    """Six arrivals within a second, one live at a time, a 2 s limit: the ones still waiting for a slot at the
    limit never send a turn, the goodput counts only the conversations that ran one, and once the run is over
    the Sessions line counts none live or waiting."""
    record = tmp_path / "waiting.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.5)) as sim:
        args = ["--arrivals", "10/s", "--seed", "3", "--sessions", "6", "--max-live", "1", "--time-limit", "2s"]
        out = rw(*small_run(sim.url, "--record", str(record), *args, "--slo", "ttft=30s", schedule="4k,8k,16k"))
    assert out.returncode == 0, out.stderr
    events = read_recording(record).events
    planned = {e.session for e in events if isinstance(e, ev.SessionPlanned)}
    ran = {e.session for e in events if isinstance(e, ev.RequestSent)}
    assert len(ran) < len(planned) == 6, (ran, planned)
    g = report_json(record)["goodput"]
    assert g["conversations"] == len(ran) and g["conversations_met"] <= len(ran)
    state = RunState(read_recording(record).header)
    for e in events:
        state.apply(e)
    assert panels.aggregate(state).arrivals == (6, 0, 0)  # the run over: none live, none still waiting


def test_a_hand_edited_slo_that_no_longer_reads_gives_a_report_without_verdicts():
    state = RunState(
        ev.Header(rampwatch_version="t", command=[], mode="run", server="x", slo="ttft=fast", warmup="soon")
    )
    state.apply(ev.SessionPlanned(t=0, session="s1", schedule=[100], salt="a"))
    state.apply(ev.RequestSent(t=0.1, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.TurnDone(t=0.4, session="s1", turn=1, status="ok", completion_tokens=2, chunks=2))
    rep = build_report(state)
    assert rep.goodput is None and rep.sessions[0].turns[0].slo_met is None


def test_the_live_share_evicts_turns_older_than_the_window():
    """A miss at 0 s, a met turn at 100 s and at 200 s: within the 5-minute window the share is 2/3; once the
    window has moved past 0 s the miss is evicted (1.0); past 200 s nothing is left (None). The totals keep all."""
    assert GOODPUT_WINDOW_S == 300.0
    tally = GoodputTally(parse_slo("ttft=1s"))
    for t, ttft in ((0.0, 9.0), (100.0, 0.5), (200.0, 0.5)):  # finished at t: a miss, then two met
        rec = TurnRecord(session="s1", turn=1, target=0, new_tokens_est=1, sent_t=t - ttft, status="ok")
        rec.first_t = t
        tally.judge(rec, t)
    assert tally.window_share(299.0) == pytest.approx(2 / 3)
    assert tally.window_share(300.5) == pytest.approx(1.0)  # the miss at 0 s is now older than the window
    assert tally.window_share(500.5) is None
    assert (tally.met, tally.judged) == (2, 3)


def test_a_turn_lost_with_its_worker_is_not_judged():
    """--workers: a turn failed as `worker lost` is the client's failure: neither met nor missed (a knee search
    would take a lost worker for the server missing its SLO); any other failed turn is a miss."""
    tally = GoodputTally(parse_slo("ttft=1s"))
    lost = TurnRecord(session="s1", turn=1, target=0, new_tokens_est=1, sent_t=0.0, status="failed", error=LOST)
    tally.judge(lost, 1.0)
    assert lost.slo_met is None and (tally.met, tally.judged) == (0, 0)
    other = TurnRecord(session="s2", turn=1, target=0, new_tokens_est=1, sent_t=0.0, status="failed", error="HTTP 503")
    tally.judge(other, 1.0)
    assert other.slo_met is False and (tally.met, tally.judged) == (0, 1)


def test_a_warmup_of_n_arrivals_takes_the_first_n_to_arrive_whatever_their_ids():
    """A trace's sessions keep their own ids (row12, agent1/sub3, Bailian chat ids): --warmup 2 leaves out the
    first two sessions to arrive, not those named s1 and s2."""
    events: list[ev.AnyEvent] = []
    for k, sid in enumerate(("agent7", "s1", "row3")):
        events += [
            ev.SessionPlanned(t=k, session=sid, schedule=[100], salt=sid, arrival=float(k)),
            ev.RequestSent(t=k, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1, due=k),
            ev.FirstToken(t=k + 0.2, session=sid, turn=1),
            ev.TurnDone(t=k + 0.4, session=sid, turn=1, status="ok", completion_tokens=2, chunks=2),
        ]
    base = ev.Header(rampwatch_version="t", command=["rampwatch"], mode="run", server="http://s", model="m")
    state = refold(base, events, warmup="2", slo="ttft=1s")
    assert {r.session: r.in_warmup for r in state.turns} == {"agent7": True, "s1": True, "row3": False}
