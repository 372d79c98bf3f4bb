"""A capacity point's figures worked out by hand from a small open-loop recording made in the test: offered and
achieved rates, goodput, TTFT per 128K new tokens, the waiting and KV peaks, preemptions; --warmup taking its
turns and its time out of every one; the live header's goodput; and the knee's line against the KV estimate."""

from __future__ import annotations

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.capacity import CapacityPoint, capacity_point
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.summary import open_loop_lines
from rampwatch.drivers.present.sweep_table import knee_lines, kv_ratio, render_capacity
from rampwatch.tui.widgets.header import header_text

HALF = 65_536  # every turn prefills half of 128K new tokens: its TTFT per 128K is twice its TTFT

# (session, turn, due, sent, first token, done): s1 and s3 run two turns, s2 one, sent 0.5 s late.
TURNS = [
    ("s1", 1, 0.0, 0.0, 0.5, 1.0),  # TTFT 0.5 s from due: 1.0 s/128K, met
    ("s1", 2, 2.0, 2.0, 2.25, 3.0),  # 0.25 s: 0.5 s/128K, met
    ("s2", 1, 10.0, 10.5, 11.5, 12.0),  # 1.5 s from due (1.0 from send): 3.0 s/128K, missed
    ("s3", 1, 20.0, 20.0, 20.75, 21.0),  # 0.75 s: 1.5 s/128K, met
    ("s3", 2, 25.0, 25.0, 26.0, 26.5),  # 1.0 s, at the bound: 2.0 s/128K, met
]
ARRIVALS = {"s1": 0.0, "s2": 10.0, "s3": 20.0}
# (t, waiting, KV usage, preemptions counter): the counter stands at 3 when the server first answers.
SAMPLES = [(1.0, 0, 0.20, 3), (11.0, 2, 0.45, 3), (21.0, 1, 0.30, 5)]
END = 30.0  # the run's last event: half a minute


def recording_state(warmup: str | None = None) -> RunState:
    header = ev.Header(
        rampwatch_version="t", command=[], mode="run", server="x", arrivals_per_s=0.1, seed=1, slo="ttft=1s"
    )
    header.warmup = warmup
    state = RunState(header)
    events: list[ev.AnyEvent] = []
    for sid, at in ARRIVALS.items():
        turns = sum(1 for s, *_ in TURNS if s == sid)
        events.append(ev.SessionPlanned(t=at, session=sid, schedule=[HALF * k for k in range(1, turns + 1)], salt=sid))
        events[-1].arrival = at
    for sid, turn, due, sent, first, done in TURNS:
        events += [
            ev.RequestSent(
                t=sent, session=sid, turn=turn, target_tokens=HALF * turn, new_tokens_est=HALF, body_bytes=1, due=due
            ),
            ev.FirstToken(t=first, session=sid, turn=turn),
            ev.TurnDone(
                t=done,
                session=sid,
                turn=turn,
                status="ok",
                prompt_tokens=HALF * turn,
                cached_tokens=HALF * (turn - 1),
                completion_tokens=2,
                chunks=2,
            ),
        ]
    for t, waiting, kv, preempted in SAMPLES:
        values = {"waiting": float(waiting), "running": 1.0, "kv_usage": kv, "preemptions": float(preempted)}
        events.append(ev.MetricsSample(t=t, source="x", engine="vllm", values=values))
    events.append(ev.RunEnded(t=END, status="done", exit_code=0))
    for e in sorted(events, key=lambda e: e.t):
        state.apply(e)
    return state


def point(state: RunState) -> CapacityPoint:
    p = capacity_point(state)
    assert p is not None
    return p


def test_a_capacity_point_has_the_figures_worked_out_by_hand():
    p = point(recording_state())
    assert p.offered_per_min == pytest.approx(6.0)  # 0.1 arrivals a second
    assert (p.arrived, p.turns, p.failed_turns) == (3, 5, 0)
    assert p.minutes == pytest.approx(0.5)
    assert p.turns_per_min == pytest.approx(10.0)  # 5 turns in half a minute
    assert p.goodput_turns_per_min == pytest.approx(8.0)  # 4 met (s2's missed)
    assert p.goodput_share == pytest.approx(0.8)
    # Per 128K, sorted: 0.5, 1.0, 1.5, 2.0, 3.0; p50 the middle one, p99 at rank 3.96: 2.0 + 0.96 x (3.0 - 2.0).
    assert p.ttft_p50_per_128k_s == pytest.approx(1.5)
    assert p.ttft_p99_per_128k_s == pytest.approx(2.96)
    assert p.waiting_peak == 2 and p.kv_peak == pytest.approx(0.45)
    assert p.preemptions == pytest.approx(2.0)  # the counter's growth since the server first answered: 5 - 3
    assert p.mean_conversation_s == pytest.approx((3.0 + 2.0 + 6.5) / 3)  # arrival to last reply, each
    assert p.status == "done" and p.warmup is None


def test_the_report_counts_conversations_meeting_the_slo_per_minute():
    rep = build_report(recording_state())
    g = rep.goodput
    assert g is not None and (g.conversations_met, g.conversations) == (2, 3)  # s1 and s3; s2 missed
    assert g.conversations_met_per_min == pytest.approx(4.0) and g.turns_met_per_min == pytest.approx(8.0)
    lines = open_loop_lines(rep)
    assert "1 turn sent over 10 ms late (worst 500 ms)" in lines[0]
    assert lines[1] == (
        "goodput (SLO ttft=1s): 4 of 5 turns met it, 8.00 turns/min; 2 of 3 conversations met it on every turn, "
        "4.00/min"
    )


def test_a_warmup_time_takes_its_turns_and_minutes_out_of_the_point_and_the_open_loop_line():
    """--warmup 15s: the turns due before 15 s (s1's two, s2's) are out, and the minutes start at 15 s."""
    state = recording_state("15s")
    p = point(state)
    assert p.minutes == pytest.approx(0.25) and p.turns == 2
    assert p.turns_per_min == pytest.approx(8.0) and p.goodput_turns_per_min == pytest.approx(8.0)
    assert p.goodput_share == pytest.approx(1.0)
    assert p.ttft_p50_per_128k_s == pytest.approx(1.75)  # of 1.5 and 2.0
    assert p.ttft_p99_per_128k_s == pytest.approx(1.5 + 0.99 * 0.5)
    assert p.warmup == "the first 15s"
    o = build_report(state).open_loop
    assert o is not None and o.arrived == 3 and o.late_turns == 0 and o.send_lag_max_s == 0.0  # s2's send was out
    assert o.ttft_from_due_p50_s == pytest.approx(0.875) and o.warmup == "the first 15s"


def test_a_warmup_of_arrivals_starts_the_minutes_at_the_first_turn_left_in():
    """--warmup 1: s1 is out; the window starts when s2's turn 1 was due (10 s): 3 turns in 20 s."""
    p = point(recording_state("1"))
    assert p.turns == 3 and p.minutes == pytest.approx(20 / 60)
    assert p.turns_per_min == pytest.approx(9.0) and p.goodput_share == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("warmup", "expected"),
    [
        (None, "SLO met 4/5 turns 8.0/min · 2 conv 4.0/min · 80% last 5m"),
        ("15s", "SLO met 2/2 turns 8.0/min · 1 conv 4.0/min · 100% last 5m"),  # s3 alone, over 15 s
    ],
)
def test_the_header_shows_the_turns_and_conversations_meeting_the_slo_and_their_rates(warmup, expected):
    state = recording_state(warmup)
    assert expected in header_text(state, END, "replay", None).plain
    g = state.goodput
    rep = build_report(state).goodput
    assert rep is not None and (g.met, g.judged, g.conversations_met) == (
        rep.turns_met,
        rep.turns,
        rep.conversations_met,
    )


def test_the_knee_line_gives_the_live_conversations_and_their_ratio_to_the_kv_estimate():
    """At 6/min with a 3.83 s conversation, Little's law keeps 6/60 x 3.83 = 0.383 live; a pool that fits 23 is
    60x that (23 / 0.383 = 60.0); with 100 s conversations (10 live) a pool of 4 fits 2.5x fewer."""
    p = point(recording_state())
    p.kv_fits = 23
    missed = CapacityPoint(**{**{f: getattr(p, f) for f in CapacityPoint.__struct_fields__}, "offered_per_min": 12.0})
    missed.goodput_share = 0.5
    lines = knee_lines([p, missed], 0.75, 6.0, 12.0)
    assert lines[0].startswith("knee: 6/min keeps ttft=1s for 80% of turns (at least 75%); 12/min does not")
    assert lines[1] == (
        "at the knee 0.38 conversations were live on average (6/min x 3.83s a conversation); the KV pool fits 23 "
        "such conversations at once: the knee keeps 60x fewer live than the pool fits"
    )
    p.mean_conversation_s = 100.0  # 10 live, a pool of 4: 2.5x more
    p.kv_fits = 4
    assert knee_lines([p, missed], 0.75, 6.0, 12.0)[1].endswith("the knee keeps 2.5x more live than the pool fits")


def test_the_kv_ratio_says_about_as_many_within_a_tenth():
    """A pool fitting 5 against 4.9 or 5.4 live used to read '1x fewer' / '1.1x more' of nearly the same count:
    within 10% it says about as many; 4.4 live (5 / 4.4 = 1.14) is still 1.1x fewer."""
    assert kv_ratio(4.9, 5) == kv_ratio(5.4, 5) == ": the knee keeps about as many live as the pool fits"
    assert kv_ratio(4.4, 5) == ": the knee keeps 1.1x fewer live than the pool fits"
    assert kv_ratio(4.0, None) == kv_ratio(0.0, 5) == ""


def test_the_capacity_table_says_what_warmup_each_point_left_out():
    """A sweep run with --warmup 1 says under the curve, once, what it left out of every point; points that
    differ are named rate by rate (one without a warmup: none); a sweep without one has no such line."""
    p = point(recording_state("1"))
    assert p.warmup == "the first 1 conversations"
    other = CapacityPoint(**{**{f: getattr(p, f) for f in CapacityPoint.__struct_fields__}, "offered_per_min": 12.0})
    lines = render_capacity([other, p]).splitlines()
    assert lines.count("warm-up left out of each point: the first 1 conversations") == 1
    other.warmup = None
    assert "warm-up left out: 6/min the first 1 conversations; 12/min none" in render_capacity([other, p]).splitlines()
    plain = point(recording_state())
    assert "warm-up" not in render_capacity([plain])
