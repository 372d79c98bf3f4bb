"""--trace spread past one process (issue 36): the coordinator reads the trace and hands each request to its
session's worker (--workers N), or each shard reads it and replays only its own sessions (--shard I/N). The trace's
k-th session by first appearance runs on worker (k-1) mod N with all its turns, the same sessions and prompt sizes
whatever N is, each request sent when due; a worker killed mid-trace loses its turns in flight, not the run.

The traces here are Mooncake rows (session_id, timestamp in ms, input_length, output_length, hash_ids of 64-token
blocks), their sessions named out of alphabetical order so that first appearance, not the name, must number them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.profiles import make_profile
from tests.conftest import rampwatch_cmd, report_json, rw, rw_started
from tests.simhost import ThreadedSim
from tests.test_workers import run_and_kill_a_worker

NAMES = ["zeta", "alpha", "mid", "beta", "kappa", "eta"]  # first appearance in this order: s1 .. s6


def grown_trace(path: Path, sessions: int, sizes: list[int], start_ms: int, gap_ms: int, output: int = 16) -> Path:
    """`sessions` sessions (NAMES, in order), each starting `start_ms` after the one before, their turns
    `gap_ms` apart and `sizes` tokens long, each turn growing its session's own blocks."""
    rows = [
        {"session_id": NAMES[s], "timestamp": s * start_ms + k * gap_ms, "input_length": size, "output_length": output,
         "hash_ids": list(range(s * 1000, s * 1000 + (size + 63) // 64))}
        for s in range(sessions) for k, size in enumerate(sizes)
    ]  # fmt: skip
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trace_flags(trace: Path) -> list[str]:
    return ["--trace", str(trace), "--trace-block-size", "64", "--trace-timing", "open"]


def trace_run(url: str, trace: Path, *extra: str) -> list[str]:
    """The arguments of a headless `rampwatch run` of `trace` against `url`, without GPUs."""
    return ["run", url, "--headless", "--gpu", "none", *trace_flags(trace), *extra]


def per_turn(events: list[ev.AnyEvent]) -> dict[tuple[str, int], tuple[str, int | None]]:
    """(session, turn) -> (status, prompt tokens)."""
    return {(e.session, e.turn): (e.status, e.prompt_tokens) for e in events if isinstance(e, ev.TurnDone)}


def planned(events: list[ev.AnyEvent]) -> dict[str, ev.SessionPlanned]:
    return {e.session: e for e in events if isinstance(e, ev.SessionPlanned)}


def lateness(events: list[ev.AnyEvent]) -> list[float]:
    """How long after its due time each request was sent."""
    return [e.t - e.due for e in events if isinstance(e, ev.RequestSent) and e.due is not None]


def traced_run(tmp_path: Path, trace: Path, workers: int) -> list[ev.AnyEvent]:
    record = tmp_path / f"w{workers}.jsonl"
    with ThreadedSim(make_profile("fast")) as sim:
        out = rw(*trace_run(sim.url, trace, "--seed", "5", "--workers", str(workers), "--record", str(record)))
    assert out.returncode == 0, out.stderr[-3000:]
    return list(read_recording(record).events)


@pytest.mark.serial  # timing: every request sent within 100 ms of its due time
def test_a_trace_on_two_workers_runs_the_sessions_of_one(tmp_path):
    """The same trace and seed on 1 and on 2 workers: the same sessions with the same prompt sizes and statuses,
    turn by turn; on 2, the sessions alternate workers by first appearance with all their turns on theirs, each
    worker named its sessions; on both, every request sent within a few ms of its due time."""
    trace = grown_trace(tmp_path / "t.jsonl", 4, [300, 500, 700], start_ms=150, gap_ms=600)
    one, two = traced_run(tmp_path, trace, 1), traced_run(tmp_path, trace, 2)
    assert per_turn(one) == per_turn(two) and len(per_turn(two)) == 12
    assert all(status == "ok" and tokens for status, tokens in per_turn(two).values())
    a, b = planned(one), planned(two)
    assert [(p.session, p.schedule) for p in a.values()] == [(p.session, p.schedule) for p in b.values()]
    assert list(b) == NAMES[:4] and all(p.worker is None for p in a.values())
    assert {sid: p.worker for sid, p in b.items()} == {"zeta": 0, "alpha": 1, "mid": 0, "beta": 1}
    started = sorted((e.worker, e.sessions) for e in two if isinstance(e, ev.WorkerStarted))
    assert started == [(0, ["zeta", "mid"]), (1, ["alpha", "beta"])]
    for events in (one, two):
        late = lateness(events)
        assert len(late) == 12 and all(-0.002 <= d < 0.1 for d in late), late
    times = [e.t for e in two if not isinstance(e, ev.RunEnded)]
    assert times == sorted(times)


def trace_run_with_a_worker_killed(tmp_path: Path, *extra: str) -> tuple[str, list[ev.AnyEvent]]:
    """Four growing sessions and two more 20 s in (kappa, eta), a demo at real speed on two workers, worker 1
    SIGKILLed once a turn of its is in flight: the run's stdout and events (it exited 1, and left no process)."""
    trace = grown_trace(tmp_path / "t.jsonl", 4, [2000, 4000, 8000, 16000], start_ms=100, gap_ms=500, output=64)
    late = [{"session_id": sid, "timestamp": 20_000, "input_length": 128, "output_length": 8, "hash_ids": [k, k + 1]}
            for k, sid in ((90_000, "kappa"), (91_000, "eta"))]  # fmt: skip
    trace.write_text(trace.read_text() + "".join(json.dumps(r) + "\n" for r in late))
    record = tmp_path / "run.jsonl"
    argv = [*rampwatch_cmd(), "demo", "--headless", "--workers", "2", "--time-scale", "1", "--gpus", "0"]
    argv += [*trace_flags(trace), "--trace-timing", "session", *extra, "--record", str(record)]
    proc, out, err, _ = run_and_kill_a_worker(argv, record)
    assert proc.returncode == 1, err[-3000:]
    return out, list(read_recording(record).events)


@pytest.mark.serial  # a run at real speed, a worker killed mid-turn
def test_a_worker_killed_mid_trace_loses_its_turns_and_the_run_goes_on(tmp_path):
    """SIGKILL to worker 1 while one of its trace turns is in flight: that turn fails as `worker lost`, its two
    sessions (the trace's second and fourth) are named lost, and the sixth, due to start on it 20 s in, is said
    not started; worker 0's sessions (the fifth too) run every turn, the run exits 1, and no process is left."""
    out, events = trace_run_with_a_worker_killed(tmp_path)
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    assert lost.worker == 1 and "SIGKILL" in lost.reason and lost.sessions == ["alpha", "beta"], lost
    assert lost.turns_lost >= 1
    failed = [e for e in events if isinstance(e, ev.TurnDone) and e.error == "worker lost"]
    assert len(failed) == lost.turns_lost and {e.session for e in failed} <= {"alpha", "beta"}
    done = {(e.session, e.turn) for e in events if isinstance(e, ev.TurnDone) and e.status == "ok"}
    assert {(s, k) for s in ("zeta", "mid") for k in range(1, 5)} | {("kappa", 1)} <= done  # worker 0's, all
    assert "eta" not in planned(events)
    notices = [e.message for e in events if isinstance(e, ev.Notice)]
    assert any("due to start on it later were not started: 1 (eta)" in m for m in notices), notices
    assert "worker w1 LOST (killed by SIGKILL)" in out
    assert isinstance(events[-1], ev.RunEnded) and events[-1].status == "failed"


@pytest.mark.serial  # a run at real speed, a worker killed mid-turn
def test_with_workers_restart_a_lost_workers_trace_sessions_go_on_at_their_next_turn(tmp_path):
    """The same kill with --workers-restart: the turn in flight stays failed, and worker 2 takes alpha and beta on
    at their next turn (neither announced again, no turn sent twice) and starts the sixth session when it comes
    due; every other turn runs, the run exits 1, and no process is left."""
    out, events = trace_run_with_a_worker_killed(tmp_path, "--workers-restart")
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    assert (lost.worker, lost.sessions, lost.resumed_on) == (1, ["alpha", "beta"], 2), lost
    failed = {(e.session, e.turn) for e in events if isinstance(e, ev.TurnDone) and e.status != "ok"}
    assert len(failed) == lost.turns_lost >= 1 and {s for s, _ in failed} <= {"alpha", "beta"}
    assert all(e.error == "worker lost" for e in events if isinstance(e, ev.TurnDone) and e.status != "ok")
    every = {(s, k) for s in NAMES[:4] for k in range(1, 5)} | {("kappa", 1), ("eta", 1)}
    done = [(e.session, e.turn) for e in events if isinstance(e, ev.TurnDone) and e.status == "ok"]
    assert sorted(done) == sorted(every - failed)  # each once
    sends = [(e.session, e.turn) for e in events if isinstance(e, ev.RequestSent)]
    assert sorted(sends) == sorted(every)  # none sent twice: the replacement began at the turn after the lost one
    announced = [e.session for e in events if isinstance(e, ev.SessionPlanned)]
    assert sorted(announced) == sorted(NAMES) and planned(events)["eta"].worker == 2
    (started,) = [e for e in events if isinstance(e, ev.WorkerStarted) and e.replaces == 1]
    assert started.worker == 2 and started.sessions[-1] == "eta" and set(lost.sessions) <= set(started.sessions)
    assert "went on at their next turn on w2" in out, out[-2000:]
    assert isinstance(events[-1], ev.RunEnded) and events[-1].status == "failed"


def test_three_shards_of_a_trace_merge_into_the_run_of_three_workers(tmp_path):
    """`run --shard I/3 --seed 7 --start-at T --trace FILE` three times: each replays only its own sessions (the
    trace's k-th on shard (k-1) mod 3), and the report of their merge is, turn by turn, that of the same trace and
    seed on `--workers 3` (against an engine of its own)."""
    trace = grown_trace(tmp_path / "t.jsonl", 6, [300, 600], start_ms=100, gap_ms=400)
    parts = [tmp_path / f"part-{i}.jsonl" for i in range(3)]
    with ThreadedSim(make_profile("fast")) as sim:
        start = f"{time.time() + 8:.3f}"  # every process up and probing by then
        flags = ["--seed", "7", "--start-at", start]
        runs = [
            rw_started(*trace_run(sim.url, trace, *flags, "--shard", f"{i}/3", "--record", str(part)))
            for i, part in enumerate(parts)
        ]
        for p in runs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-2000:]
    for i, part in enumerate(parts):  # each shard replayed its own sessions alone
        assert list(planned(list(read_recording(part).events))) == NAMES[i::3]
    merged = report_json_merge(*parts)
    one = tmp_path / "workers-3.jsonl"
    with ThreadedSim(make_profile("fast")) as sim:
        out = rw(*trace_run(sim.url, trace, "--seed", "7", "--workers", "3", "--record", str(one)))
    assert out.returncode == 0, out.stderr[-2000:]
    workers = report_json(one)

    def turns(r: dict) -> dict:
        keys = ("turn", "error", "context_tokens", "new_tokens", "cached_tokens", "output_tokens")
        return {s["id"]: [{k: t.get(k) for k in keys} for t in s["turns"]] for s in r["sessions"]}

    assert turns(merged) == turns(workers) and sorted(turns(merged)) == sorted(NAMES)
    assert all(len(rows) == 2 and rows[0]["error"] is None for rows in turns(merged).values())
    assert [w["sessions"] for w in workers["workers"]] == [w["sessions"] for w in merged["workers"]]
    assert merged["run"]["status"] == "done"


def report_json_merge(*parts: Path) -> dict:
    out = rw("report", "--merge", *map(str, parts), "--format", "json")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)
