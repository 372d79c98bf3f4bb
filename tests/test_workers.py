"""--workers N: a run's sessions driven from N worker processes behind one coordinator, as a user runs it. The
same seed makes the same sessions whatever N is; the lockstep barrier spans the workers; a worker that dies loses
its turns in flight, not the run; bad flags get one line."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.hub import EventHub
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.run.spread import Spread
from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
from tests.conftest import ROOT, rampwatch_cmd, report_json, rw, small_run
from tests.simhost import ThreadedSim


def seeded_run(tmp_path: Path, workers: int, *extra: str) -> tuple[Path, list[ev.AnyEvent]]:
    """A seeded four-session run on `workers` workers against a simulated engine of its own."""
    record = tmp_path / f"w{workers}.jsonl"
    with ThreadedSim(make_profile("fast")) as sim:
        args = ["--sessions", "4", "--seed", "11", "--workers", str(workers), "--record", str(record), *extra]
        out = rw(*small_run(sim.url, *args, schedule="1k,2k,4k"))
    assert out.returncode == 0, out.stderr[-3000:]
    return record, list(read_recording(record).events)


def planned(events: list[ev.AnyEvent]) -> dict[str, ev.SessionPlanned]:
    return {e.session: e for e in events if isinstance(e, ev.SessionPlanned)}


def prompts(events: list[ev.AnyEvent]) -> dict[tuple[str, int], int | None]:
    return {(e.session, e.turn): e.prompt_tokens for e in events if isinstance(e, ev.TurnDone)}


def test_the_same_seed_makes_the_same_sessions_on_one_or_two_workers(tmp_path):
    """Seed 11 on 1 and on 2 workers: the same salts, schedules, needles and prompt token counts, turn by turn;
    on 2, s1 and s3 on w0 and s2 and s4 on w1, each worker started, its clock measured, its loop checked."""
    one_path, one = seeded_run(tmp_path, 1)
    two_path, two = seeded_run(tmp_path, 2)
    a, b = planned(one), planned(two)
    assert sorted(a) == sorted(b) == ["s1", "s2", "s3", "s4"]
    for sid in a:
        assert (a[sid].salt, a[sid].schedule, a[sid].needle_sha) == (b[sid].salt, b[sid].schedule, b[sid].needle_sha)
    assert prompts(one) == prompts(two) and len(prompts(one)) == 12
    assert {sid: p.worker for sid, p in b.items()} == {"s1": 0, "s2": 1, "s3": 0, "s4": 1}
    assert all(p.worker is None for p in a.values())
    started = sorted((e.worker, e.sessions) for e in two if isinstance(e, ev.WorkerStarted))
    assert started == [(0, ["s1", "s3"]), (1, ["s2", "s4"])]
    clocks = [e for e in two if isinstance(e, ev.WorkerClock)]
    assert {c.worker for c in clocks} == {0, 1}
    assert all(abs(c.offset_s) <= c.uncertainty_s + 0.005 for c in clocks)  # one machine: one monotonic clock
    assert {e.worker for e in two if isinstance(e, ev.ClientLag)} == {0, 1}

    assert read_recording(two_path).header.workers == 2
    times = [e.t for e in two if not isinstance(e, ev.RunEnded)]
    assert times == sorted(times)  # the workers' events merged in time order
    rep = report_json(two_path)
    assert [w["sessions"] for w in rep["workers"]] == [["s1", "s3"], ["s2", "s4"]]
    assert rep["run"]["status"] == "done" and report_json(one_path)["workers"] is None


def test_no_more_workers_start_than_there_are_sessions(tmp_path):
    """--workers 6 for 4 sessions starts 4 (a sweep's first points would start workers for no session), each
    session on the worker it would have had, and the header says 4."""
    record, events = seeded_run(tmp_path, 6)
    started = sorted((e.worker, e.sessions) for e in events if isinstance(e, ev.WorkerStarted))
    assert started == [(0, ["s1"]), (1, ["s2"]), (2, ["s3"]), (3, ["s4"])]
    assert read_recording(record).header.workers == 4


def test_the_same_seed_draws_the_same_arrivals_on_any_number_of_workers(tmp_path):
    """An open loop: the seed's arrival times, counted from the drive's start, are the same on 1 and 2 workers;
    each worker starts its own sessions at them."""
    arrivals = ("--arrivals", "240/min")
    _, one = seeded_run(tmp_path, 1, *arrivals)
    _, two = seeded_run(tmp_path, 2, *arrivals)

    def offsets(events: list[ev.AnyEvent]) -> dict[str, float]:
        p = planned(events)
        first = min(e.arrival for e in p.values() if e.arrival is not None)
        return {sid: e.arrival - first for sid, e in p.items() if e.arrival is not None}

    assert offsets(one) == pytest.approx(offsets(two), abs=1e-9) and len(offsets(two)) == 4
    for e in planned(two).values():
        assert e.arrival is not None and e.arrival <= e.t < e.arrival + 0.5
    assert prompts(one) == prompts(two)


@pytest.mark.serial  # timing: the pair's TTFT ratio
def test_the_lockstep_demo_keeps_its_shape_with_its_sessions_on_two_workers(tmp_path):
    """The two-session lockstep demo with s1 on w0 and s2 on w1: each turn starts on both within a few ms (the
    barrier spans the workers), so the one queued behind the other's prefill waits twice as long, turn by turn."""
    record = tmp_path / "demo.jsonl"
    out = rw("demo", "--headless", "--workers", "2", "--scale-to", "256k", "--record", str(record), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    events = list(read_recording(record).events)
    assert {sid: p.worker for sid, p in planned(events).items()} == {"s1": 0, "s2": 1}
    sent: dict[int, list[float]] = {}
    for e in events:
        if isinstance(e, ev.RequestSent):
            sent.setdefault(e.turn, []).append(e.t)
    assert all(len(ts) == 2 and max(ts) - min(ts) < 0.05 for ts in sent.values()), sent
    rep = report_json(record)
    ratios = [s["ratio"] for s in rep["turn_spread"]]
    assert len(ratios) == len(sent) > 5 and all(1.8 < r < 2.2 for r in ratios), ratios


@pytest.mark.serial  # a run at real speed, a worker killed mid-turn
def test_a_killed_worker_loses_its_turns_in_flight_and_the_run_goes_on(tmp_path):
    """SIGKILL to worker 1 while its turn is in flight: that turn fails as `worker lost`, its sessions end and
    are reported, the lockstep barrier lets the others go on to their last turn, the run exits 1, and no process
    is left."""
    record = tmp_path / "run.jsonl"
    argv = [*rampwatch_cmd(), "demo", "--headless", "--workers", "2", "--sessions", "4", "--time-scale", "1"]
    argv += ["--schedule", "2k,4k,8k,16k", "--record", str(record)]
    proc, out, err, pid = run_and_kill_a_worker(argv, record)
    assert proc.returncode == 1, err[-3000:]
    events = list(read_recording(record).events)
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    assert lost.worker == 1 and "SIGKILL" in lost.reason and lost.sessions == ["s2", "s4"] and lost.turns_lost >= 1
    failed = [e for e in events if isinstance(e, ev.TurnDone) and e.error == "worker lost"]
    assert len(failed) == lost.turns_lost and {e.session for e in failed} <= {"s2", "s4"}
    done = {(e.session, e.turn) for e in events if isinstance(e, ev.TurnDone) and e.status == "ok"}
    assert {(s, k) for s in ("s1", "s3") for k in range(1, 5)} <= done  # w0's sessions ran every turn
    assert "worker w1 LOST (killed by SIGKILL)" in out
    assert isinstance(events[-1], ev.RunEnded) and events[-1].status == "failed"


@pytest.mark.serial  # a run at real speed, a worker killed mid-turn
def test_a_killed_worker_is_replaced_and_its_sessions_go_on_at_their_next_turn(tmp_path):
    """--workers-restart: SIGKILL to worker 1 mid-turn fails that turn as `worker lost`; a new worker (w2) picks
    s2 and s4 up at their next turn with their history (the server finds their earlier turns in its prefix
    cache), the lockstep barrier waits for them, every other turn is done, the run exits 1 (a turn failed), the
    report says where they went, and no process is left."""
    record = tmp_path / "run.jsonl"
    argv = [*rampwatch_cmd(), "demo", "--headless", "--workers", "2", "--workers-restart", "--sessions", "4"]
    argv += ["--time-scale", "1", "--schedule", "2k,4k,8k,16k", "--record", str(record)]
    proc, out, err, pid = run_and_kill_a_worker(argv, record)
    assert proc.returncode == 1, err[-3000:]
    events = list(read_recording(record).events)
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    assert lost.worker == 1 and lost.sessions == ["s2", "s4"] and lost.turns_lost >= 1 and lost.resumed_on == 2
    (started,) = [e for e in events if isinstance(e, ev.WorkerStarted) and e.worker == 2]
    assert started.replaces == 1 and started.pid != pid and set(started.sessions) <= {"s2", "s4"}
    turns = {(e.session, e.turn): e for e in events if isinstance(e, ev.TurnDone)}
    failed = {key for key, e in turns.items() if e.status != "ok"}
    assert failed and all(turns[key].error == "worker lost" for key in failed)
    assert set(turns) == {(s, k) for s in ("s1", "s2", "s3", "s4") for k in range(1, 5)}  # every turn ended
    for session, lost_turn in failed:
        later = [turns[(session, k)] for k in range(lost_turn + 1, 5)]
        assert all(t.status == "ok" for t in later), later
        if later and lost_turn > 1:  # its history went with it: the server finds the turns before in its cache
            before = turns[(session, lost_turn - 1)]
            assert later[0].cached_tokens >= 0.8 * before.prompt_tokens, (later[0], before)
            assert abs(later[0].prompt_tokens - 2048 * 2**lost_turn) <= 0.05 * 2048 * 2**lost_turn  # on schedule
    assert "worker w1 LOST (killed by SIGKILL)" in out and "went on at their next turn on w2" in out
    workers = report_json(record)["workers"]
    assert workers[1]["resumed_on"] == 2 and workers[2]["replaces"] == 1


@pytest.mark.serial  # a sweep at real speed, a worker killed mid-turn
def test_a_sweep_goes_on_past_a_lost_worker_and_its_sessions_with_it(tmp_path):
    """sweep --workers 2 --workers-restart: worker 1 SIGKILLed mid-turn in the first point fails that turn as
    `worker lost` and a new worker takes its session on; the sweep goes on to its next point (a turn lost with its
    worker is the client's failure, not the server's limit) and exits 1, as a turn failed. It had stopped there."""
    sweep = tmp_path / "sw.sweep.json"
    with ThreadedSim(make_profile("tiny")) as sim:
        argv = [*rampwatch_cmd(), "sweep", sim.url, "--headless", "--gpu", "none", "--workers", "2"]
        argv += ["--workers-restart", "--sessions", "2,4", "--schedule", "2k,4k,8k,16k,24k", "--output-tokens", "300"]
        argv += ["--ignore-eos", "--record", str(sweep)]
        proc, out, err, pid = run_and_kill_a_worker(argv, tmp_path / "sw-2s.jsonl")
    assert proc.returncode == 1, err[-3000:]
    assert "stopped" not in out and "went on at their next turn on w2" in out
    ran = json.loads(sweep.read_text())
    assert ran["runs"] == ["sw-2s.jsonl", "sw-4s.jsonl"] and not ran.get("stopped"), ran
    events = list(read_recording(tmp_path / "sw-2s.jsonl").events)
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    assert lost.worker == 1 and lost.resumed_on == 2 and lost.turns_lost >= 1
    turns = {(e.session, e.turn): e.status for e in events if isinstance(e, ev.TurnDone)}
    assert set(turns) == {(s, k) for s in ("s1", "s2") for k in range(1, 6)}  # every turn ended, s2's on w2 too
    later = list(read_recording(tmp_path / "sw-4s.jsonl").events)
    assert {e.status for e in later if isinstance(e, ev.TurnDone)} == {"ok"}


@pytest.mark.serial  # a worker killed mid-turn, arrivals still to come
def test_an_open_loop_goes_on_with_a_lost_workers_arrivals_on_its_replacement(tmp_path):
    """--workers-restart in an open loop: the conversations worker 1 had started go on at their next turn on w2,
    and those still to arrive arrive there, at their own times; every session runs and every turn ends."""
    record = tmp_path / "open.jsonl"
    with ThreadedSim(make_profile("tiny", step_overhead_s=0.02)) as sim:  # turns of ~2 s: one is in flight
        flags = ("--arrivals", "120/min", "--sessions", "8", "--seed", "5", "--ignore-eos")
        argv = [*rampwatch_cmd(), *small_run(sim.url, *flags, schedule="4k,8k", output_tokens=150)]
        argv += ["--workers", "2", "--workers-restart", "--record", str(record)]
        proc, out, err, _ = run_and_kill_a_worker(argv, record, turn=1)
    assert proc.returncode == 1, err[-3000:]
    events = list(read_recording(record).events)
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    (started,) = [e for e in events if isinstance(e, ev.WorkerStarted) and e.worker == 2]
    assert lost.resumed_on == 2 and started.replaces == 1
    plans = planned(events)
    assert set(plans) == {f"s{k}" for k in range(1, 9)}  # every conversation arrived, w1's late ones included
    arrived_late = {sid for sid, e in plans.items() if e.worker == 2}
    assert arrived_late and all(plans[sid].arrival >= lost.t - 0.5 for sid in arrived_late)
    assert arrived_late <= set(started.sessions) <= set(lost.sessions) | arrived_late
    resumed = set(started.sessions) & set(lost.sessions)  # arrived on w1, its turn 1 lost: turn 2 on w2
    assert resumed and lost.turns_lost >= 1
    turns = {(e.session, e.turn): e for e in events if isinstance(e, ev.TurnDone)}
    assert set(turns) == {(f"s{k}", t) for k in range(1, 9) for t in (1, 2)}
    assert all(e.status == "ok" or e.error == "worker lost" for e in turns.values())


def run_and_kill_a_worker(
    argv: list[str], record: Path, worker: int = 1, turn: int = 2
) -> tuple[subprocess.Popen, str, str, int]:
    """`argv` run as a user runs it, worker `worker` SIGKILLed once a turn of its (`turn` or later) is in flight,
    to the run's end, with no worker process left: (the run, its stdout, its stderr, the killed worker's pid)."""
    proc = procs.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = wait_for_in_flight_turn(record, worker=worker, proc=proc, turn=turn)
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
        children = psutil.Process().children(recursive=True)
        assert not [p for p in children if p.pid == pid or "rampwatch.drivers.run.worker" in " ".join(p.cmdline())]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, out, err, pid


def wait_for_in_flight_turn(
    record: Path, worker: int, proc: subprocess.Popen, timeout: float = 120, turn: int = 2
) -> int:
    """The pid of worker `worker` once the recording shows one of its turns (`turn` or later) sent and not done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        if record.exists():
            events = list(read_recording(record, skip_bad_lines=True).events)
            pids = {e.worker: e.pid for e in events if isinstance(e, ev.WorkerStarted)}
            mine = {e.session for e in events if isinstance(e, ev.SessionPlanned) and e.worker == worker}
            sent = {(e.session, e.turn) for e in events if isinstance(e, ev.RequestSent) and e.session in mine}
            done = {(e.session, e.turn) for e in events if isinstance(e, ev.TurnDone)}
            if worker in pids and any(k >= turn for _, k in sent - done):
                return pids[worker]
        time.sleep(0.1)
    pytest.fail(f"worker {worker} had no turn in flight within {timeout:.0f} s")


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "many"], "--workers"),
        (["--workers-per-node", "2"], "--cluster"),
        (["--cluster", "slurm"], "--cluster"),
        (["--shard", "3/3", "--seed", "1", "--start-at", "0"], "--shard"),
        (["--shard", "0/3"], "--seed"),
        (["--shard", "0/3", "--seed", "1", "--start-at", "0", "--lockstep"], "--lockstep"),
        (["--shard", "0/2", "--seed", "1", "--start-at", "0", "--workers", "2"], "--shard"),
        (["--start-at", "tomorrow"], "--start-at"),
        (["--workers-restart"], "--workers-restart"),
    ],
)
def test_bad_worker_flags_get_one_line_and_exit_2(flags, says):
    with ThreadedSim(make_profile("fast")) as sim:
        out = rw(*small_run(sim.url, "--no-record", *flags))
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and says in lines[0], out.stderr


def test_a_text_trace_runs_on_workers_with_workers_restart(tmp_path):
    """An AIPerf trace (turns as text, hash ids derived as ranges) on two workers with --workers-restart: each
    request crosses to its worker (a range crashed the coordinator's encoder once), every turn is sent as the trace
    wrote it, and none fails."""
    record = tmp_path / "text.jsonl"
    trace = ROOT / "tests/data/traces/aiperf.jsonl"
    with ThreadedSim(make_profile("fast")) as sim:
        flags = ["--trace", str(trace), "--workers", "2", "--workers-restart", "--record-text"]
        out = rw("run", sim.url, "--headless", "--gpu", "none", "--record", str(record), *flags)
    assert out.returncode == 0, out.stderr[-3000:]
    events = list(read_recording(record).events)
    sent = [e.text for e in events if isinstance(e, ev.RequestSent) and e.session == "chat-b"]
    assert sent == [t["text"] for t in json.loads(trace.read_text().splitlines()[1])["turns"]]
    done = [e for e in events if isinstance(e, ev.TurnDone)]
    assert len(done) == 7 and all(e.status == "ok" for e in done)
    assert {p.worker for p in planned(events).values()} == {0, 1}


def test_the_one_shot_baseline_runs_after_the_workers(tmp_path):
    """--one-shot with workers: the ramps on the workers, then the baseline in the coordinator, alone."""
    record = tmp_path / "one-shot.jsonl"
    with ThreadedSim(make_profile("fast")) as sim:
        out = rw(*small_run(sim.url, "--sessions", "2", "--workers", "2", "--one-shot", "--record", str(record)))
    assert out.returncode == 0, out.stderr[-3000:]
    events = list(read_recording(record).events)
    base = planned(events)["one-shot"]
    assert base.worker is None and base.role == "one-shot"
    ramp_end = max(e.t for e in events if isinstance(e, ev.TurnDone) and e.session != "one-shot")
    (sent,) = [e for e in events if isinstance(e, ev.RequestSent) and e.session == "one-shot"]
    assert sent.t > ramp_end
    assert report_json(record)["one_shot"] is not None


def test_the_lockstep_barrier_holds_from_the_first_turn_across_workers(tmp_path):
    """--lockstep with s2 staggered 2 s: s1 (on w0) sends turn 2 only after s2 (on w1) finished turn 1."""
    record = tmp_path / "lockstep.jsonl"
    with ThreadedSim(make_profile("fast")) as sim:
        args = ["--sessions", "2", "--workers", "2", "--lockstep", "--stagger", "2", "--record", str(record)]
        out = rw(*small_run(sim.url, *args, schedule="1k,2k"))
    assert out.returncode == 0, out.stderr[-3000:]
    events = list(read_recording(record).events)
    s2_first_done = next(e.t for e in events if isinstance(e, ev.TurnDone) and (e.session, e.turn) == ("s2", 1))
    s1_second = next(e.t for e in events if isinstance(e, ev.RequestSent) and (e.session, e.turn) == ("s1", 2))
    assert s1_second >= s2_first_done


def test_the_time_limit_counts_from_start_at(tmp_path):
    """--start-at 4 s away with --time-limit 3s: the sessions start at the agreed time and run until the limit
    counted from then (the wait is not taken off it)."""
    record = tmp_path / "start-at.jsonl"
    with ThreadedSim(make_profile("tiny")) as sim:
        start = f"{time.time() + 4:.3f}"
        args = ["--sessions", "2", "--seed", "3", "--shard", "0/1", "--start-at", start, "--time-limit", "3s"]
        out = rw(*small_run(sim.url, *args, "--record", str(record), schedule="1k,2k,4k,8k"))
    assert out.returncode == 0, out.stderr[-3000:]
    recording = read_recording(record)
    events = list(recording.events)
    sent = [e for e in events if isinstance(e, ev.RequestSent)]
    agreed = float(start) - datetime.fromisoformat(recording.header.started_at).timestamp()  # on the run's clock
    assert sent and min(e.t for e in sent) >= agreed - 0.01  # not before the agreed time, however long the start
    assert any("waiting" in e.message and "--start-at" in e.message for e in events if isinstance(e, ev.Notice))


@pytest.mark.serial  # process lifetimes, timed
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_an_open_loop_run_stopped_or_killed_takes_its_workers_along(tmp_path, sig):
    """An open loop on two workers, arrivals still to come: Ctrl-C ends it (130) with every turn sent given an
    end and no worker left; SIGKILL of rampwatch leaves no worker either (they die with it). Its turns last most of a
    second: with 8-token turns (40-90 ms) a turn's sending and end were often written to the recording together,
    and once no turn of worker 1's showed in flight before the run ended."""
    record = tmp_path / "open.jsonl"
    with ThreadedSim(make_profile("tiny")) as sim:
        arrivals = ("--arrivals", "120/min", "--sessions", "40", "--seed", "5", "--ignore-eos")
        argv = [*rampwatch_cmd(), *small_run(sim.url, *arrivals, output_tokens=400)]
        argv += ["--workers", "2", "--record", str(record)]
        proc = procs.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            pid = wait_for_in_flight_turn(record, worker=1, proc=proc, turn=1)
            pids = [
                e.pid for e in read_recording(record, skip_bad_lines=True).events if isinstance(e, ev.WorkerStarted)
            ]
            assert pid in pids and len(pids) == 2
            proc.send_signal(sig)
            proc.communicate(timeout=60)
            _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=5)
            assert not alive, f"{sig.name}: workers still running: {[p.pid for p in alive]}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        events = list(read_recording(record).events)
        sent = {(e.session, e.turn) for e in events if isinstance(e, ev.RequestSent)}
        ended = {(e.session, e.turn) for e in events if isinstance(e, ev.TurnDone)}
        assert sent and sent <= ended and isinstance(events[-1], ev.RunEnded)
        assert not [e for e in events if isinstance(e, ev.WorkerLost)]


async def test_worker_processes_spawned_while_a_run_prepares_end_with_a_run_that_never_starts():
    """Local workers' processes start as the run prepares (their imports overlap the server's probe); those no
    session needs end once the sessions are known, and a run that never starts (its server unreachable, a bad
    flag found later) ends the rest, and reaps them."""
    spread = Spread(EventHub(None), time.monotonic)
    cfg = spread.connect(RunConfig(url="http://127.0.0.1:1", workers=3))
    spawned = [w.proc for w in spread._spawned.values()]
    assert len(spawned) == 3 and all(p is not None and p.poll() is None for p in spawned)
    spread.trim(dataclasses.replace(cfg, workers=2))  # two sessions: the third worker's process ends now
    assert [p is not None and p.poll() is None for p in spawned] == [True, True, False]
    await spread.aclose()
    assert all(p is not None and p.poll() is not None for p in spawned)
