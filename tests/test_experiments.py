"""The seed's experiments inside one run: lockstep sessions, the one-shot
baseline, the time limit, the strict needle and decode stalls."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

import httpx
import pytest

from rampwatch.drivers.client.chat import ChatStreamParser
from rampwatch.drivers.client.ramp import SEED_SCHEDULE, Conversation
from rampwatch.drivers.client.session import MASKED_CODE, SessionRunner
from rampwatch.drivers.client.streamer import TurnOptions
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.model.gaps import gap_stats
from rampwatch.drivers.run.config import BadInput, parse_duration
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.clock import VirtualClock
from rampwatch.drivers.sim.engine import SimEngine, SimRequest
from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
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
    for _ in range(2):
        gate.after(2)
    gate.join()  # a session that starts late (the one-shot baseline) holds the barrier too
    third = asyncio.create_task(gate.before(3))
    await asyncio.sleep(0.01)
    assert not third.done()
    gate.after(2)
    assert await asyncio.wait_for(third, 1.0)
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
    p = ChatStreamParser(lambda t: None, lambda ts, counts, piled: None)
    chunks = [
        {"choices": [{"delta": {"reasoning_content": "the code is AB12-CD34"}}]},
        {"choices": [{"delta": {"content": "I do not know"}}]},
    ]
    p.feed(b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n", 1.0)
    res = p.finish()
    assert res.chunks == 2 and res.first_t == 1.0  # reasoning still counts as generated text for TTFT
    assert res.text == "I do not know" and "AB12-CD34" in res.reasoning


@pytest.mark.parametrize("strict", [False, True])
async def test_strict_needle_masks_the_code_in_the_history(sim, strict):
    conv = Conversation("strict-test", [2000, 4000])
    async with httpx.AsyncClient() as client:
        events: list[ev.AnyEvent] = []
        runner = SessionRunner(
            "s1",
            conv,
            client,
            sim.url,
            {},
            TurnOptions(model="sim-model", output_tokens=24, strict_needle=strict),
            events.append,
            RunClock(),
        )
        assert await runner.run()
    done = [e for e in events if isinstance(e, ev.TurnDone)]
    assert [e.needle for e in done] == [True, True]  # the fact in turn 1 is still there to find
    kept = runner.history[1].decode()  # the first reply as it went back to the server
    assert (conv.needle.value in kept) is not strict and (MASKED_CODE in kept) is strict


# -- through the driver, against the simulated engine -----------------------------------


def test_lockstep_sends_no_turn_before_every_session_finished_the_last(sim, tmp_path):
    record = tmp_path / "lock.jsonl"
    run = drive(
        sim.url, sessions=3, stagger=0.3, schedule=[2000, 4000, 6000], output_tokens=16, lockstep=True, record=record
    )
    assert run.exit_code == 0
    recording = read_recording(record)
    events = recording.events
    assert recording.header.lockstep
    for turn in (2, 3):
        sent = min(e.t for e in events if isinstance(e, ev.RequestSent) and e.turn == turn)
        done_before = max(e.t for e in events if isinstance(e, ev.TurnDone) and e.turn == turn - 1)
        assert sent >= done_before
    rep = build_report(run.state)
    assert [s.turn for s in rep.turn_spread] == [1, 2, 3] and rep.ttft_ratio_median >= 1.0


def time_limit_notice(events: list[ev.AnyEvent]) -> ev.Notice:
    return next(e for e in events if isinstance(e, ev.Notice) and e.message.startswith("time limit"))


def test_time_limit_stops_new_turns_and_says_where_each_session_got(tmp_path):
    # The ramp takes ~8 s unloaded and turn 1 goes out ~0.5 s in: a busier machine only reaches fewer turns.
    with ThreadedSim(make_profile("tiny", time_scale=0.2)) as s:
        run = drive(
            s.url,
            sessions=2,
            schedule=[2000, 4000, 8000, 16000, 24000],
            output_tokens=64,
            ignore_eos=True,
            time_limit=3.0,
            record=tmp_path / "limit.jsonl",
        )
    assert run.exit_code == 0
    rep = build_report(run.state)
    assert rep.run.status == "time-limit" and rep.run.time_limit_s == 3.0
    reached = [s.summary.reached_turn for s in rep.sessions]
    assert all(0 < r < 5 for r in reached), reached
    assert all(r.status == "ok" for r in run.state.turns)  # grace 0: the turn in flight finished
    events = read_recording(tmp_path / "limit.jsonl").events
    limit = time_limit_notice(events)
    assert limit.t >= 3.0 and all(e.t < limit.t for e in events if isinstance(e, ev.RequestSent))  # none after it
    assert isinstance(events[-1], ev.RunEnded)


def test_time_limit_grace_cancels_the_turn_in_flight(tmp_path):
    # Turn 1 goes out ~0.5 s into the run (the probe and calibration come first; the limit leaves room for a
    # busy machine) and would take ~60 s: only the grace's end can stop it.
    with ThreadedSim(make_profile("tiny", time_scale=0.02)) as s:
        run = drive(
            s.url,
            sessions=1,
            schedule=[2000, 30000],
            output_tokens=512,
            ignore_eos=True,
            time_limit=3.0,
            grace=0.5,
            keep_events=True,
        )
    assert run.exit_code == 0 and run.state.ended.status == "time-limit"
    assert [r.status for r in run.state.turns] == ["cancelled"]
    limit = time_limit_notice(run.hub.events)
    assert limit.t >= 3.0 and run.state.turns[0].sent_t < limit.t  # sent before the limit...
    assert run.state.ended.t >= limit.t + 0.5  # ...and cancelled only once the grace was over


def test_one_shot_is_a_fresh_baseline_after_the_ramp(sim, tmp_path):
    record = tmp_path / "shot.jsonl"
    run = drive(sim.url, sessions=2, schedule=[2000, 4000, 8000], output_tokens=16, one_shot=True, record=record)
    assert run.exit_code == 0
    rep = build_report(run.state)
    assert rep.one_shot is not None and [r.session for r in rep.one_shot.ramps] == ["s1", "s2"]
    shot = rep.one_shot.turn
    assert shot.context_tokens == pytest.approx(8000, rel=0.02) and shot.cached_tokens < 64 and shot.needle
    assert len(rep.sessions) == 2  # the baseline is not a ramp session
    last_ramp = max(r.done_t for r in run.state.turns if r.session != "one-shot")
    assert next(r for r in run.state.turns if r.session == "one-shot").sent_t >= last_ramp
    planned = [e for e in read_recording(record).events if isinstance(e, ev.SessionPlanned)]
    assert [p.role for p in planned] == ["ramp", "ramp", "one-shot"]


def test_one_shot_alone_with_a_one_turn_schedule(sim):
    run = drive(sim.url, sessions=2, schedule=[8000], output_tokens=8, one_shot=True)
    assert run.exit_code == 0 and list(run.state.sessions) == ["one-shot"]
    assert build_report(run.state).one_shot is not None


def test_report_formats_carry_the_new_figures(sim, tmp_path):
    drive(
        sim.url,
        sessions=2,
        schedule=[2000, 4000],
        output_tokens=16,
        lockstep=True,
        one_shot=True,
        strict_needle=True,
        record=tmp_path / "all.jsonl",
    )
    out = {
        fmt: procs.run(
            [*rampwatch_cmd(), "report", str(tmp_path / "all.jsonl"), "--format", fmt],
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout
        for fmt in ("table", "md", "csv", "json")
    }
    for fmt in ("table", "md"):
        assert "slowest/fastest TTFT per turn" in out[fmt] and "one-shot" in out[fmt] and "p99" in out[fmt]
        assert "lockstep, strict needle" in out[fmt]
    assert "gap_p99_s" in out["csv"].splitlines()[0] and any(
        line.startswith("one-shot,") for line in out["csv"].splitlines()
    )
    rep = json.loads(out["json"])
    assert rep["run"]["needle_mode"] == "strict" and rep["run"]["lockstep"] and rep["one_shot"]["turn"]["turn"] == 1


# -- the phenomena, on the calibrated glm-like engine, on its own virtual clock ----------------------------
# The engine alone, stepping on a VirtualClock: every figure is the engine's own simulated time, so the checks
# hold however busy the machine is and take well under a second. tests/bench_experiments.py measures the same
# phenomena end to end through the driver, in real time, and prints them.


class EngineSession:
    """One conversation straight against a SimEngine: each turn re-sends the whole history, grown with a reply
    and fresh text to the turn's target, as the driver's sessions do over HTTP."""

    def __init__(self, engine: SimEngine, salt: str):
        self.engine, self.salt = engine, salt
        self.history = f"<|user|>\nsession {salt}\n".encode()
        self.requests: list[SimRequest] = []
        self.token_times: dict[int, list[float]] = {}  # request id -> the engine's time at each token

    def send(self, context_tokens: int, output_tokens: int) -> SimRequest:
        grow = context_tokens * self.engine.profile.chars_per_token - len(self.history)
        words = f" {self.salt} words {len(self.requests)}".encode()
        self.history += (words * (grow // len(words) + 1))[: max(0, grow)]
        req = self.engine.make_request(self.history, output_tokens, ignore_eos=True)
        self.requests.append(req)
        self.token_times[req.id] = []
        self.engine.submit(req)
        return req

    async def finish(self, req: SimRequest) -> None:
        """Wait for the reply, noting when each token came out, and keep it in the history."""
        seen = 0
        while True:
            await req.wake.wait()
            req.wake.clear()
            self.token_times[req.id] += [self.engine.clock.now()] * (req.generated - seen)
            seen = req.generated
            if req.finished:
                break
        self.history += (req.text(0, req.generated) + "\n<|user|>\n").encode()

    async def turn(self, context_tokens: int, output_tokens: int) -> SimRequest:
        req = self.send(context_tokens, output_tokens)
        await self.finish(req)
        return req


def ttft(req: SimRequest) -> float:
    assert req.first_t is not None
    return req.first_t - req.arrival


async def on_virtual_engine(profile_name: str, body):
    """Run `body(engine)` with a SimEngine stepping on a virtual clock; returns what it returns."""
    engine = SimEngine(make_profile(profile_name), clock=VirtualClock())
    loop = asyncio.create_task(engine.run())
    try:
        return await body(engine)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_lockstep_demo_shows_one_session_waiting_about_twice_as_long():
    sessions: list[EngineSession] = []

    async def lockstep(engine: SimEngine) -> None:
        sessions.extend(EngineSession(engine, f"s{k}") for k in (1, 2))
        for target in SEED_SCHEDULE:  # both sessions send each turn together, once both finished the last
            reqs = [s.send(target, 64) for s in sessions]
            await asyncio.gather(*(s.finish(r) for s, r in zip(sessions, reqs)))

    await on_virtual_engine("glm-like", lockstep)
    a, b = (s.requests for s in sessions)
    ratios = {turn: max(ttft(x), ttft(y)) / min(ttft(x), ttft(y)) for turn, (x, y) in enumerate(zip(a, b), 1)}
    assert all(ratios[k] >= 1.5 for k in range(3, 11)), ratios
    assert 1.6 <= ratios[10] <= 2.1, ratios
    # Decode stalls behind the other session's prefill: the gaps between one session's tokens while the other's
    # first token is still to come, against the gaps once the other is decoding or done.
    during, alone = [], []
    pairs = [(x, y, sessions[0]) for x, y in zip(a, b)] + [(y, x, sessions[1]) for x, y in zip(a, b)]
    for mine, theirs, session in pairs:
        times = session.token_times[mine.id]
        for before, after in zip(times, times[1:]):
            (during if after <= theirs.first_t else alone).append(after - before)
    assert during and alone
    stalled, free = statistics.median(during), statistics.median(alone)
    assert stalled > 3 * free, (stalled, free)


async def test_ramp_against_one_shot_on_the_glm_like_engine():
    async def ramp_then_one_shot(engine: SimEngine) -> tuple[list[SimRequest], SimRequest]:
        ramp = EngineSession(engine, "ramp")
        turns = [await ramp.turn(target, 16) for target in SEED_SCHEDULE]
        return turns, await EngineSession(engine, "one-shot").turn(SEED_SCHEDULE[-1], 16)

    turns, shot = await on_virtual_engine("glm-like", ramp_then_one_shot)
    assert shot.cached_tokens < 64 and all(t.cached_tokens > 0 for t in turns[1:])  # a fresh prompt vs a growing one
    summed, longest = sum(ttft(t) for t in turns), max(ttft(t) for t in turns)
    assert summed / ttft(shot) == pytest.approx(1.0, abs=0.15), (summed, ttft(shot))
    assert longest / ttft(shot) < 1 / 5, (longest, ttft(shot))


async def test_the_virtual_clock_moves_by_the_modelled_step_times_only():
    async def one_request(engine: SimEngine) -> SimRequest:
        return await EngineSession(engine, "alone").turn(2048, 4)

    req = await on_virtual_engine("tiny", one_request)
    p = make_profile("tiny")
    prefill = [
        (start, min(p.max_num_batched_tokens, req.prompt_tokens - start))
        for start in range(0, req.prompt_tokens, p.max_num_batched_tokens)
    ]
    expected_ttft = sum(p.step_time([chunk], []) for chunk in prefill)
    assert ttft(req) == pytest.approx(expected_ttft, rel=1e-9)  # no machine time leaked in: exactly the model's
    decode = sum(p.step_time([], [req.prompt_tokens + k]) for k in range(1, 4))
    assert req.last_t - req.first_t == pytest.approx(decode, rel=1e-9)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--time-limit", "-5"], "not a duration"),
        (["--time-limit", "1x"], "not a duration"),
        (["--grace", "-1"], "must not be negative"),
    ],
)
def test_bad_experiment_flags_get_one_line(args, message):
    p = procs.run([*rampwatch_cmd(), "run", "http://127.0.0.1:9", *args], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and message in p.stderr and p.stderr.count("\n") == 1


def test_one_shot_longer_than_the_server_takes_is_bad_input(sim):
    p = procs.run(
        [
            *rampwatch_cmd(),
            "run",
            sim.url,
            "--schedule",
            "64k",
            "--one-shot",
            "--headless",
            "--no-record",
            "--gpu",
            "none",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 2 and "max_model_len" in p.stderr and p.stderr.count("\n") == 1
