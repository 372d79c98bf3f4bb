"""Open-loop sweeps (issue 22): `sweep --arrivals RATES` runs each rate, a saturated point ends early and the
sweep with it, and `sweep --find-max` finds the knee an FCFS queue model of the simulated engine predicts.
The search's bookkeeping and the saturation rule are checked on their own first."""

from __future__ import annotations

import functools
import json
import math
import statistics
import time

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.capacity import saturation
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.workers import LOST
from rampwatch.drivers.run.arrivals import arrival_times
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.run.sweep_plan import KneeSearch
from rampwatch.drivers.sim.profiles import make_profile
from tests.conftest import rw as rw_in_root
from tests.simhost import ThreadedSim

rw = functools.partial(rw_in_root, timeout=900)  # a knee search runs minutes


def sweep_args(url: str, *extra: str, schedule: str = "1k") -> list[str]:
    return ["sweep", url, "--schedule", schedule, "--output-tokens", "8", "--gpu", "none", *extra]


# -- the search on its own -------------------------------------------------------------------------------


@pytest.mark.parametrize("knee", [0.1, 0.7, 1.3, 3.0, 9.0])
def test_the_search_brackets_any_knee_and_bisects_it_in_six_points(knee):
    """A server that keeps the SLO up to `knee`: the search starts at the range's ends, halves or doubles
    outside them, then bisects; after six points the knee lies between the highest kept and lowest missed rate."""
    search = KneeSearch(0.5, 4.0, max_points=6)
    while (rate := search.next_rate()) is not None:
        search.record(rate, rate <= knee)
    assert len(search.tried) == 6
    assert [r for r, _ in search.tried[:1]] == [0.5]
    assert search.knee is not None and search.lowest_fail is not None
    assert search.knee <= knee < search.lowest_fail
    inside = 0.5 <= knee < 4.0
    assert search.step() == pytest.approx(8 ** (1 / 16) if inside else 2 ** (1 / 4), rel=0.3)


def test_a_server_that_keeps_every_rate_tried_has_its_knee_above_the_range():
    search = KneeSearch(1.0, 2.0, max_points=4)
    while (rate := search.next_rate()) is not None:
        search.record(rate, True)
    assert [r for r, _ in search.tried] == [1.0, 2.0, 4.0, 8.0]
    assert search.knee == 8.0 and search.lowest_fail is None and search.step() is None


# -- the saturation rule ---------------------------------------------------------------------------------


def state_with_waiting(samples: list[tuple[float, float]]) -> RunState:
    state = RunState()
    for t, waiting in samples:
        state.apply(ev.MetricsSample(t=t, source="s", engine="vllm", values={"waiting": waiting, "running": 1.0}))
    return state


def test_a_queue_whose_floor_rises_for_the_window_is_saturated():
    rising = [(t, 1 + t // 10) for t in range(0, 61, 2)]
    assert "waiting queue grew for 60s" in saturation(state_with_waiting(rising), 60.0)


@pytest.mark.parametrize(
    "samples",
    [
        [(t, 1 + t // 10) for t in range(0, 50, 2)],  # rising, but not yet for a whole window
        [(t, 0 if t == 40 else 5) for t in range(0, 61, 2)],  # emptied once
        [(t, 5 + (t % 4)) for t in range(0, 61, 2)],  # busy but level
    ],
    ids=["too-short", "emptied", "level"],
)
def test_a_queue_that_empties_or_holds_level_is_not_saturated(samples):
    assert saturation(state_with_waiting(samples), 60.0) is None


def test_a_turn_lost_with_its_worker_is_not_the_server_saturating():
    """--workers: a worker that dies fails its turns as `worker lost`, the client's failure; a sweep goes on and
    a knee search does not take it for the server's limit. Any other failed turn still is."""
    state = RunState()
    state.apply(ev.SessionPlanned(t=0, session="s1", schedule=[100], salt="a"))
    state.apply(ev.RequestSent(t=0, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.TurnDone(t=1, session="s1", turn=1, status="failed", error=LOST))
    assert saturation(state, 60.0) is None
    state.apply(ev.RequestSent(t=1, session="s1", turn=2, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.TurnDone(t=2, session="s1", turn=2, status="failed", error="HTTP 503"))
    assert saturation(state, 60.0) == "1 turn failed"


# -- sweeps as a user runs them --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--arrivals", "0", "--time-limit", "5s"],
        ["--arrivals", "fast", "--time-limit", "5s"],
        ["--arrivals", "1,2/min"],  # no --time-limit
        ["--find-max", "--time-limit", "5s"],  # no --slo
        ["--find-max", "--slo", "ttft=", "--time-limit", "5s"],
        ["--find-max", "--slo", "foo=1s", "--time-limit", "5s"],
        ["--find-max", "--slo", "ttft=1s", "--arrivals", "2/min", "--time-limit", "5s"],  # not a range
        ["--find-max", "--slo", "ttft=1s", "--time-limit", "5s", "--max-points", "2"],
        ["--find-max", "--slo", "ttft=1s", "--time-limit", "5s", "--slo-share", "0"],
        ["--sessions", "1,2", "--arrivals", "1/min", "--time-limit", "5s"],
        ["--arrivals", "1/min", "--time-limit", "5s", "--lockstep"],
        [],  # neither --sessions nor --arrivals
    ],
)
def test_bad_sweep_values_get_one_line_and_exit_2(flags):
    out = rw(*sweep_args("http://127.0.0.1:9", "--no-record", *flags))
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr


def test_a_sweep_over_rates_runs_each_and_prints_the_curve(tmp_path):
    """Two rates, each for --time-limit: one recording per rate (arrivals and seed in its header, the same seed
    for both), the sweep file lists them, and the table has a row per rate whose goodput is the recording's.
    The seed is drawn, so the rates are high enough that a point without an arrival in 5 s (which ends the
    sweep) is a chance of e^-10, not the e^-2.5 (8%) of 30/min."""
    path = tmp_path / "rates.sweep.json"
    with ThreadedSim(make_profile("tiny")) as sim:
        flags = ["--arrivals", "120,240/min", "--time-limit", "5s", "--slo", "ttft=2s", "--record", str(path)]
        out = rw(*sweep_args(sim.url, *flags))
    assert out.returncode == 0, out.stderr[-2000:]
    sweep = json.loads(path.read_text())
    assert sweep["schema"] == 3 and sweep["arrivals_per_min"] == [120.0, 240.0] and len(sweep["runs"]) == 2
    seeds = set()
    for name, rate in zip(sweep["runs"], (120.0, 240.0), strict=True):
        header = read_recording(tmp_path / name).header
        assert header.arrivals_per_s * 60 == pytest.approx(rate) and header.slo == "ttft=2s"
        seeds.add(header.seed)
    assert len(seeds) == 1
    assert "sweep: one point per arrival rate (open loop)" in out.stdout
    table = out.stdout.split("sweep: one point per arrival rate (open loop)")[1]
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["120", "240"]
    compared = rw("compare", str(path), "--format", "json")
    assert compared.returncode == 0, compared.stderr
    assert len(json.loads(compared.stdout)["runs"]) == 2  # compare reads an open-loop sweep file as its runs


@pytest.mark.serial  # asserts how long the sweep took
def test_a_point_stops_early_when_the_server_saturates_and_the_sweep_with_it(tmp_path):
    """A server that can take one 8K prefill a second, offered one a second and more: its waiting queue never
    empties and grows, so the first point ends as saturated long before its 2-minute limit, the turns in flight
    cancelled, and the higher rate never runs."""
    path = tmp_path / "sat.sweep.json"
    profile = make_profile("fast", step_overhead_s=0.01, max_num_batched_tokens=80)
    with ThreadedSim(profile) as sim:
        flags = ["--arrivals", "90,180/min", "--time-limit", "2m", "--saturation-window", "6s"]
        began = time.monotonic()
        out = rw(*sweep_args(sim.url, *flags, "--scrape-interval", "0.5", "--record", str(path), schedule="8k"))
        took = time.monotonic() - began
    assert out.returncode == 0, out.stderr[-2000:]
    assert took < 60, took
    sweep = json.loads(path.read_text())
    assert sweep["arrivals_per_min"] == [90.0] and "saturated at 90/min" in sweep["stopped"]
    rec = read_recording(tmp_path / sweep["runs"][0])
    ended = [e for e in rec.events if isinstance(e, ev.RunEnded)][-1]
    assert ended.status == "saturated"
    notices = [e.message for e in rec.events if isinstance(e, ev.Notice)]
    assert any(m.startswith("stopping early: the waiting queue grew for 6s") for m in notices), notices
    assert "saturated" in out.stdout.split("sweep: one point per arrival rate")[1]


# -- the knee --------------------------------------------------------------------------------------------

# The simulated engine as an FCFS queue with a known capacity: the 'fast' profile with a fixed 10 ms step and a
# budget of 164 prompt tokens a step, so one conversation's single 8K turn is about 0.5 s of the engine's time
# and it serves about 120 a minute. Its decode (8 tokens, one step) costs one token of the budget: nothing.
STEP_S, BUDGET = 0.010, 164
SEED, LIMIT_S, GRACE_S, TTFT_SLO_S, SHARE = 5, 40.0, 2.0, 2.0, 0.95
LOW, HIGH = 40.0, 160.0  # per minute: the range searched, 4x, so six points bisect it to 4**(1/16) = 1.09x
ONE_STEP = (HIGH / LOW) ** (1 / 16)  # the bracket six points leave: 1.09x


def predicted_share(per_min: float, begun: float, lag: float, service: float) -> float:
    """The share of turns meeting ttft<=2s that an FCFS single server predicts: the seed's arrivals at this
    rate (from the drive's start `begun`, until the time limit), each reaching the engine `lag` after it was
    due, served `service` seconds in order (Lindley's recursion); a turn not done by the limit's grace is cut,
    a miss."""
    rate = per_min / 60
    times = [t for t in arrival_times(rate, 1000, SEED) if begun + t < LIMIT_S]
    free, met = 0.0, 0
    for a in times:
        free = max(a + lag, free) + service
        met += free - a <= TTFT_SLO_S and begun + free <= LIMIT_S + GRACE_S
    return met / len(times)


def predicted_knee(begun: float, lag: float, service: float) -> float:
    """The highest rate whose predicted share is at least SHARE (bisection to a hair)."""
    lo, hi = 1.0, 1000.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if predicted_share(mid, begun, lag, service) >= SHARE else (lo, mid)
    return lo


@pytest.mark.serial  # the knee is the simulated engine's real-time capacity
def test_find_max_finds_the_knee_an_fcfs_queue_model_predicts_within_one_bisection_step(tmp_path):
    """sweep --find-max over 40..160/min (seed 5, 40 s a point): the knee it reports lies within one bisection
    step of the knee Lindley's recursion predicts for the same seeded arrivals, with the engine's service time
    from the turns' measured prompt tokens (tokens / 164 x 10 ms) and the client's measured send lag; at most
    six points. The model's inputs are measured; the model is the derivation."""
    path = tmp_path / "knee.sweep.json"
    profile = make_profile("fast", step_overhead_s=STEP_S, max_num_batched_tokens=BUDGET)
    flags = [
        *("--find-max", "--arrivals", f"{LOW:g}..{HIGH:g}/min", "--seed", str(SEED)),
        *("--slo", f"ttft={TTFT_SLO_S:g}s", "--time-limit", f"{LIMIT_S:g}s", "--grace", f"{GRACE_S:g}"),
        *("--ignore-eos", "--record", str(path)),
    ]
    with ThreadedSim(profile) as sim:
        began = time.monotonic()
        out = rw(*sweep_args(sim.url, *flags, schedule="8k"))
        took = time.monotonic() - began
    assert out.returncode == 0, out.stderr[-3000:]
    assert took < 600, f"the search took {took:.0f}s, over the 10 minutes the issue allows"
    sweep = json.loads(path.read_text())
    assert 3 <= len(sweep["runs"]) <= 6
    knee, fail = sweep["knee_per_min"], sweep["knee_fail_per_min"]
    assert knee is not None and fail is not None, sweep
    # Six points over a 4x range: both ends, then four bisections, each halving the bracket's log: 4**(1/16).
    step = fail / knee
    assert step <= ONE_STEP * 1.0001, f"the search's bracket {knee:.4g}..{fail:.4g}/min is wider than one step"

    prompts, lags, begun = [], [], []
    for name in sweep["runs"]:
        rec = read_recording(tmp_path / name)
        rate = rec.header.arrivals_per_s
        planned = [e for e in rec.events if isinstance(e, ev.SessionPlanned)]
        begun.append(planned[0].arrival - arrival_times(rate, 1, SEED)[0])
        sent = {(e.session, e.turn): e for e in rec.events if isinstance(e, ev.RequestSent)}
        lags += [e.t - e.due for e in sent.values() if e.due is not None]
        prompts += [e.prompt_tokens for e in rec.events if isinstance(e, ev.TurnDone) and e.prompt_tokens]
    service = statistics.median(prompts) / BUDGET * STEP_S
    lag, start = statistics.median(lags), statistics.median(begun)
    expected = predicted_knee(start, lag, service)
    print(
        f"knee search: {len(sweep['runs'])} points in {took:.0f}s; reported {knee:.4g}/min (missed {fail:.4g}); "
        f"predicted {expected:.4g}/min (service {service:.3f}s, lag {lag * 1000:.0f} ms, begun {start:.2f}s)"
    )
    # Within one bisection step of the derived knee: the reported (highest kept) rate is at most one step above
    # or below the rate Lindley's recursion predicts. On this 2-core machine the derivation gives ~80.7/min
    # (service 0.500 s, send lag 1 ms, arrivals from 0.37 s) and the search reports 80/min, missing 87.2/min.
    assert knee / ONE_STEP <= expected <= knee * ONE_STEP, (
        f"derived knee {expected:.4g}/min is not within one step ({ONE_STEP:.4f}x) of the reported {knee:.4g}/min"
    )
    assert f"knee: {knee:.4g}/min keeps ttft=2s" in out.stdout
