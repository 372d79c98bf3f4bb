"""The seed's experiments inside one run: lockstep sessions, the one-shot
baseline, the time limit, the strict needle and decode stalls."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from rampwatch.drivers.client.chat import ChatStreamParser
from rampwatch.drivers.client.ramp import SEED_SCHEDULE, Conversation
from rampwatch.drivers.client.session import MASKED_CODE, SessionRunner, TurnOptions
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.model.turns import gap_stats
from rampwatch.drivers.run.config import BadInput, parse_duration
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.profiles import make_profile
from tests.conftest import drive, rampwatch_cmd
from tests.simhost import ThreadedSim

ROOT = Path(__file__).resolve().parents[1]


# -- pieces ---------------------------------------------------------------------------


async def test_lockstep_gate_holds_each_turn_until_every_live_session_is_done():
    gate = TurnGate(3, lockstep=True)
    assert await gate.before(1)
    started = asyncio.create_task(gate.before(2))
    gate.after(1)
    gate.after(1)
    await asyncio.sleep(0.01)
    assert not started.done()  # one session is still on turn 1
    gate.leave()  # ...and it ends (failed or gone): it leaves the barrier
    assert await asyncio.wait_for(started, 1.0)
    gate.expire()
    assert not await gate.before(3)  # the time limit: no new turn


def test_gap_stats_and_quantiles():
    g = gap_stats([0.01] * 98 + [0.5, 2.0] + [0.0] * 150)  # zeros: chunks read together, one delivery
    assert g is not None and g.count == 100 and g.p50_s == 0.01 and g.max_s == 2.0
    assert g.over_100ms == 2 and g.over_1s == 1
    assert 0.5 <= g.p99_s <= 2.0
    assert gap_stats([]) is None and gap_stats([0.0, 0.0]) is None


def test_durations():
    assert parse_duration("40s") == 40 and parse_duration("90m") == 5400 and parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    for bad in ("-5", "1x", "", "0s", "5 m s"):
        with pytest.raises(BadInput):
            parse_duration(bad)


def test_only_content_answers_the_needle_never_reasoning():
    p = ChatStreamParser(lambda t: None, lambda ts: None)
    chunks = [{"choices": [{"delta": {"reasoning_content": "the code is AB12-CD34"}}]},
              {"choices": [{"delta": {"content": "I do not know"}}]}]
    p.feed(b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n", 1.0)
    res = p.finish()
    assert res.chunks == 2 and res.first_t == 1.0  # reasoning still counts as generated text for TTFT
    assert res.text == "I do not know" and "AB12-CD34" in res.reasoning


@pytest.mark.parametrize("strict", [False, True])
async def test_strict_needle_masks_the_code_in_the_history(sim, strict):
    conv = Conversation("strict-test", [2000, 4000])
    async with httpx.AsyncClient() as client:
        events: list[ev.AnyEvent] = []
        runner = SessionRunner("s1", conv, client, sim.url, {}, TurnOptions(model="sim-model", output_tokens=24,
                               strict_needle=strict), events.append, RunClock())
        assert await runner.run()
    done = [e for e in events if isinstance(e, ev.TurnDone)]
    assert [e.needle for e in done] == [True, True]  # the fact in turn 1 is still there to find
    kept = runner.history[1].decode()  # the first reply as it went back to the server
    assert (conv.needle.value in kept) is not strict and (MASKED_CODE in kept) is strict


# -- through the driver, against the simulated engine -----------------------------------


def test_lockstep_sends_no_turn_before_every_session_finished_the_last(sim, tmp_path):
    run = drive(sim.url, sessions=3, stagger=0.3, schedule=[2000, 4000, 6000], output_tokens=16, lockstep=True,
                record=tmp_path / "lock.jsonl")
    assert run.exit_code == 0
    events = read_recording(tmp_path / "lock.jsonl").events
    assert read_recording(tmp_path / "lock.jsonl").header.lockstep
    for turn in (2, 3):
        sent = min(e.t for e in events if isinstance(e, ev.RequestSent) and e.turn == turn)
        done_before = max(e.t for e in events if isinstance(e, ev.TurnDone) and e.turn == turn - 1)
        assert sent >= done_before
    rep = build_report(run.state)
    assert [s.turn for s in rep.turn_spread] == [1, 2, 3] and rep.ttft_ratio_median >= 1.0


def test_time_limit_stops_new_turns_and_says_where_each_session_got(tmp_path):
    with ThreadedSim(make_profile("tiny", time_scale=0.2)) as s:
        run = drive(s.url, sessions=2, schedule=[2000, 4000, 8000, 16000, 24000], output_tokens=64, ignore_eos=True,
                    time_limit=1.5, record=tmp_path / "limit.jsonl")
    assert run.exit_code == 0
    rep = build_report(run.state)
    assert rep.run.status == "time-limit" and rep.run.time_limit_s == 1.5
    reached = [s.summary.reached_turn for s in rep.sessions]
    assert all(0 < r < 5 for r in reached), reached
    assert all(r.status == "ok" for r in run.state.turns)  # grace 0: the turn in flight finished
    assert isinstance(read_recording(tmp_path / "limit.jsonl").events[-1], ev.RunEnded)


def test_time_limit_grace_cancels_the_turn_in_flight(tmp_path):
    # Turn 1 goes out ~0.5 s into the run (the probe and calibration come first) and would take ~25 s.
    with ThreadedSim(make_profile("tiny", time_scale=0.05)) as s:
        run = drive(s.url, sessions=1, schedule=[2000, 30000], output_tokens=512, ignore_eos=True,
                    time_limit=2.0, grace=0.5)
    assert run.exit_code == 0 and run.state.ended.status == "time-limit"
    assert [r.status for r in run.state.turns] == ["cancelled"]
    assert run.state.ended.t < 4.0


def test_one_shot_is_a_fresh_baseline_after_the_ramp(sim, tmp_path):
    run = drive(sim.url, sessions=2, schedule=[2000, 4000, 8000], output_tokens=16, one_shot=True,
                record=tmp_path / "shot.jsonl")
    assert run.exit_code == 0
    rep = build_report(run.state)
    assert rep.one_shot is not None and [r.session for r in rep.one_shot.ramps] == ["s1", "s2"]
    shot = rep.one_shot.turn
    assert shot.context_tokens == pytest.approx(8000, rel=0.02) and shot.cached_tokens < 64 and shot.needle
    assert len(rep.sessions) == 2  # the baseline is not a ramp session
    last_ramp = max(r.done_t for r in run.state.turns if r.session != "one-shot")
    assert next(r for r in run.state.turns if r.session == "one-shot").sent_t >= last_ramp
    planned = [e for e in read_recording(tmp_path / "shot.jsonl").events if isinstance(e, ev.SessionPlanned)]
    assert [p.role for p in planned] == ["ramp", "ramp", "one-shot"]


def test_one_shot_alone_with_a_one_turn_schedule(sim):
    run = drive(sim.url, sessions=2, schedule=[8000], output_tokens=8, one_shot=True)
    assert run.exit_code == 0 and list(run.state.sessions) == ["one-shot"]
    assert build_report(run.state).one_shot is not None


def test_report_formats_carry_the_new_figures(sim, tmp_path):
    drive(sim.url, sessions=2, schedule=[2000, 4000], output_tokens=16, lockstep=True, one_shot=True,
          strict_needle=True, record=tmp_path / "all.jsonl")
    out = {fmt: subprocess.run([*rampwatch_cmd(), "report", str(tmp_path / "all.jsonl"), "--format", fmt],
                               capture_output=True, text=True, cwd=ROOT).stdout for fmt in ("table", "md", "csv", "json")}
    for fmt in ("table", "md"):
        assert "slowest/fastest TTFT per turn" in out[fmt] and "one-shot" in out[fmt] and "p99" in out[fmt]
        assert "lockstep, strict needle" in out[fmt]
    assert "gap_p99_s" in out["csv"].splitlines()[0] and any(line.startswith("one-shot,") for line in out["csv"].splitlines())
    rep = json.loads(out["json"])
    assert rep["run"]["needle_mode"] == "strict" and rep["run"]["lockstep"] and rep["one_shot"]["turn"]["turn"] == 1


# -- the phenomena, on the calibrated glm-like engine -------------------------------------


def test_lockstep_demo_shows_one_session_waiting_about_twice_as_long():
    with ThreadedSim(make_profile("glm-like", time_scale=50.0)) as s:
        run = drive(s.url, sessions=2, schedule=list(SEED_SCHEDULE), output_tokens=64, ignore_eos=True, lockstep=True)
    assert run.exit_code == 0
    rep = build_report(run.state)
    ratios = {x.turn: x.ratio for x in rep.turn_spread}
    assert all(ratios[k] >= 1.5 for k in range(3, 11)), ratios
    assert 1.6 <= ratios[10] <= 2.1, ratios
    gaps = rep.interference
    assert gaps.gaps_during_foreign_prefill.p50_s > 3 * gaps.gaps_alone.p50_s  # decode stalls behind the other's prefill


def test_ramp_against_one_shot_on_the_glm_like_engine():
    with ThreadedSim(make_profile("glm-like", time_scale=200.0)) as s:
        run = drive(s.url, schedule=list(SEED_SCHEDULE), output_tokens=16, ignore_eos=True, one_shot=True)
    assert run.exit_code == 0
    vs = build_report(run.state).one_shot.ramps[0]
    assert vs.sum_ratio == pytest.approx(1.0, abs=0.15), vs
    assert vs.longest_ratio < 1 / 5, vs


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args,message", [
    (["--time-limit", "-5"], "not a duration"),
    (["--time-limit", "1x"], "not a duration"),
    (["--grace", "-1"], "must not be negative"),
])
def test_bad_experiment_flags_get_one_line(args, message):
    p = subprocess.run([*rampwatch_cmd(), "run", "http://127.0.0.1:9", *args], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and message in p.stderr and p.stderr.count("\n") == 1


def test_one_shot_longer_than_the_server_takes_is_bad_input(sim):
    p = subprocess.run([*rampwatch_cmd(), "run", sim.url, "--schedule", "64k", "--one-shot", "--headless", "--no-record",
                        "--gpu", "none"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and "max_model_len" in p.stderr and p.stderr.count("\n") == 1
