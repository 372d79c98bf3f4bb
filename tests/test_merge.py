"""--merge: the recordings of a run's shards (run --shard I/N) read as the one run they are. One simulated run is
split by session into shards (each on a clock started at its own time, each with its own copy of the servers'
samples), and the merge must give back that run's report; percentiles come from the pooled turns; what is not
one run's shards is refused in one line."""

from __future__ import annotations

import json
import math
import time
import typing
from datetime import datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import modelled
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.capacity import capacity_point
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.stats import median, quantile
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.merge import merge_shards
from rampwatch.drivers.run.recording import Recorder, Recording, read_recording
from tests.conftest import drive, rw, rw_started, small_run

SHARDS = 3
# How much earlier than the whole run each shard's clock started (a pod started before --start-at, or later
# than another): its times are that much larger, and the merge must take it off again.
EARLIER_S = [0.0, 0.25, 1.5]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """One three-session ramp against the simulated engine, recorded: the run the shards are cut from."""
    from rampwatch.drivers.sim.profiles import make_profile
    from tests.simhost import ThreadedSim

    out = tmp_path_factory.mktemp("whole") / "whole.jsonl"
    with ThreadedSim(make_profile("tiny")) as sim:
        run = drive(sim.url, sessions=SHARDS, schedule=[2000, 4000], output_tokens=8, record=out)
    assert run.exit_code == 0
    return out


def shard_of(session: str, n: int) -> int:
    """Session k (s1, s2, ...) is shard (k-1) mod n's; the one-shot baseline shard 0's."""
    return (int(session[1:]) - 1) % n if session[1:].isdigit() else 0


def split(rec: Recording, n: int = SHARDS, earlier: list[float] = EARLIER_S, salt: str = "") -> list[Recording]:
    """`rec` as its n shards would have recorded it: each session's events in its shard's recording; the servers'
    samples, the loop's lag and the end in every one (the servers' in shards past the first read 10x higher, as
    if scraped at another moment: counted twice, they would show); the rest in shard 0. Shard i's clock started
    `earlier[i]` s before the run's, so its times are that much later and its start that much earlier."""
    started = datetime.fromisoformat(rec.header.started_at)
    parts: list[list[ev.AnyEvent]] = [[] for _ in range(n)]
    for e in rec.events:
        session = getattr(e, "session", None)
        if isinstance(e, ev.MetricsSample):
            for i in range(n):
                values = {k: v * (10 if i else 1) for k, v in e.values.items()}
                parts[i].append(msgspec.structs.replace(e, values=values))
        elif isinstance(e, ev.ClientLag | ev.RunEnded):
            for part in parts:
                part.append(e)
        else:
            parts[shard_of(session, n) if session else 0].append(e)
    out = []
    for i, events in enumerate(parts):
        header = msgspec.structs.replace(
            rec.header,
            shard=(i, n),
            seed=7,
            salt=salt or rec.header.salt,
            started_at=(started - timedelta(seconds=earlier[i])).isoformat(timespec="milliseconds"),
        )
        out.append(Recording(header=header, events=[modelled.shifted(e, earlier[i]) for e in events]))
    return out


def write(path: Path, rec: Recording) -> Path:
    recorder = Recorder(path, rec.header)
    for e in rec.events:
        recorder.write(e)
    recorder.close()
    return path


def write_shards(folder: Path, parts: list[Recording], stem: str = "part") -> list[Path]:
    return [write(folder / f"{stem}-{i}.jsonl", part) for i, part in enumerate(parts)]


def approx(a: object, b: object, where: str = "") -> None:
    """`a` and `b` (JSON) alike, floats to 1e-9: the shift there and back is exact to rounding."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, int | float) and isinstance(b, int | float), where
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (where, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, a, b)
        for k in a:
            approx(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (where, a, b)
        for k, (x, y) in enumerate(zip(a, b)):
            approx(x, y, f"{where}[{k}]")
    else:
        assert a == b, (where, a, b)


def report_json(*args: str) -> dict:
    out = rw("report", *args, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_merged_shards_report_the_whole_run(whole, tmp_path):
    """Shards given in any order: the report of their merge is the whole run's (every turn's figures, the
    sessions' summaries, interference and the servers'), on the clock of the earliest shard (which started 1.5 s
    before the run's own: the whole run as such a clock recorded it)."""
    rec = read_recording(whole)
    parts = write_shards(tmp_path, split(rec))
    d = max(EARLIER_S)
    started = (datetime.fromisoformat(rec.header.started_at) - timedelta(seconds=d)).isoformat(timespec="milliseconds")
    as_earliest = Recording(
        header=msgspec.structs.replace(rec.header, started_at=started),
        events=[modelled.shifted(e, d) for e in rec.events],
    )
    original = write(tmp_path / "whole-on-the-earliest-clock.jsonl", as_earliest)
    merged = report_json("--merge", *map(str, [parts[2], parts[0], parts[1]]))
    assert [s["id"] for s in merged["sessions"]] == ["s1", "s2", "s3"]
    assert sum(len(s["turns"]) for s in merged["sessions"]) == 6
    # Each shard is a worker with its own loop (here each part carries the whole run's lag reports): those differ.
    assert [w["worker"] for w in merged.pop("workers")] == [0, 1, 2]
    assert [w["worker"] for w in merged.pop("client_workers")] == [0, 1, 2]
    whole_report = report_json(str(original))
    assert whole_report.pop("workers") is None and len(whole_report.pop("client_workers")) == 1
    approx(merged, whole_report)
    table = rw("report", "--merge", *map(str, parts), "--format", "csv")
    assert table.returncode == 0 and table.stderr == ""
    assert table.stdout == rw("report", str(original), "--format", "csv").stdout


def test_real_shards_of_a_simulated_run_merge_into_one_run(tmp_path):
    """Three `run --shard I/3` processes of one seeded six-session run against one simulated engine, starting
    together at --start-at: their merge is the run, s1..s6 with every turn, each shard a worker, the servers'
    samples of one shard; and its per-turn report is that of the same seeded run on `--workers 3` (against an
    engine of its own, so neither finds the other's prompts cached)."""
    from rampwatch.drivers.sim.profiles import make_profile
    from tests.simhost import ThreadedSim

    parts = [tmp_path / f"part-{i}.jsonl" for i in range(SHARDS)]
    with ThreadedSim(make_profile("tiny")) as sim:
        start = f"{time.time() + 8:.3f}"  # every process up and probing by then
        shard = ["--sessions", "6", "--seed", "7", "--start-at", start]
        runs = [
            rw_started(*small_run(sim.url, *shard, "--shard", f"{i}/{SHARDS}", "--record", str(part)))
            for i, part in enumerate(parts)
        ]
        for p in runs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-2000:]
    rep = report_json("--merge", *map(str, parts))
    assert [s["id"] for s in rep["sessions"]] == [f"s{k}" for k in range(1, 7)]
    assert all(len(s["turns"]) == 2 and all(t["ttft_s"] for t in s["turns"]) for s in rep["sessions"])
    assert rep["run"]["status"] == "done" and rep["run"]["sessions"] == 6
    recs = [read_recording(p) for p in parts]
    merged = merge_shards([(str(p), r) for p, r in zip(parts, recs)]).recording
    planned = {e.session: e.worker for e in merged.events if isinstance(e, ev.SessionPlanned)}
    assert planned == {f"s{k}": (k - 1) % SHARDS for k in range(1, 7)}
    samples = [sum(isinstance(e, ev.MetricsSample) for e in r.events) for r in [*recs, merged]]
    assert samples[-1] == samples[0] > 0  # shard 0's, not every shard's
    one = tmp_path / "workers-3.jsonl"
    with ThreadedSim(make_profile("tiny")) as sim:
        out = rw(*small_run(sim.url, "--sessions", "6", "--seed", "7", "--workers", "3", "--record", str(one)))
    assert out.returncode == 0, out.stderr[-2000:]

    def per_turn(r: dict) -> dict:
        keys = ("turn", "error", "needle", "context_tokens", "new_tokens", "cached_tokens", "output_tokens")
        return {s["id"]: [{k: t.get(k) for k in keys} for t in s["turns"]] for s in r["sessions"]}

    workers = report_json(str(one))
    assert per_turn(workers) == per_turn(rep) and len(per_turn(rep)) == 6
    assert [w["sessions"] for w in workers["workers"]] == [w["sessions"] for w in rep["workers"]]


def test_the_merged_stream(whole):
    """One header (no shard, every part named, the sessions summed), each shard a worker on its host, its sessions
    and loop lag tagged with it, the servers' samples of one shard only, one end, and times in order."""
    rec = read_recording(whole)
    parts = split(rec)
    merged = merge_shards([(f"part-{i}.jsonl", p) for i, p in enumerate(parts)]).recording
    h = merged.header
    assert h.shard is None and h.workers == SHARDS and h.sessions == SHARDS
    assert h.merged_from == [f"part-{i}.jsonl" for i in range(SHARDS)]
    started = [e for e in merged.events if isinstance(e, ev.WorkerStarted)]
    assert sorted((w.worker, w.sessions, w.node) for w in started) == [
        (i, [f"s{i + 1}"], rec.header.host) for i in range(SHARDS)
    ]
    assert [w.t for w in started] == sorted(w.t for w in started)  # each at its shard's start: the earliest first
    planned = {e.session: e.worker for e in merged.events if isinstance(e, ev.SessionPlanned)}
    assert planned == {"s1": 0, "s2": 1, "s3": 2}
    lags = [e.worker for e in merged.events if isinstance(e, ev.ClientLag)]
    assert sorted(set(lags)) == [0, 1, 2] and len(lags) == SHARDS * sum(isinstance(e, ev.ClientLag) for e in rec.events)

    def samples(events: list[ev.AnyEvent]) -> list[dict[str, float]]:
        return [e.values for e in events if isinstance(e, ev.MetricsSample)]

    assert samples(merged.events) == samples(rec.events) and samples(rec.events)  # shard 0's alone, not 10x
    ends = [e for e in merged.events if isinstance(e, ev.RunEnded)]
    assert len(ends) == 1 and merged.events[-1] is ends[0] and ends[0].status == "done"
    times = [e.t for e in merged.events if not isinstance(e, ev.TokenTimes | ev.RunEnded)]
    assert times == sorted(times) or all(b >= a - 1.0 for a, b in zip(times, times[1:]))
    state = RunState(h)
    for e in merged.events:
        state.apply(e)
    assert sorted(state.workers.by_id) == [0, 1, 2] and state.workers.clock_uncertainty_s is None


def open_loop_shard(i: int, ttfts: list[float], salt: str = "x", sessions: int = 5) -> Recording:
    """Shard i of 2 of an open-loop run of `sessions`: one session a turn, each turn's TTFT given (4096 new tokens
    each)."""
    header = ev.Header(
        rampwatch_version="t",
        command=["rampwatch"],
        mode="run",
        server="http://s",
        model="m",
        engine="vllm",
        sessions=sessions,
        salt=salt,
        seed=7,
        arrivals_per_s=1.0,
        shard=(i, 2),
        started_at=f"2026-12-03T20:00:0{i}.000+00:00",
    )
    events: list[ev.AnyEvent] = []
    for k, ttft in enumerate(ttfts):
        sid, t = f"s{2 * k + i + 1}", 10.0 * k
        events += [
            ev.SessionPlanned(t=t, session=sid, schedule=[4096], salt=salt, arrival=t),
            ev.RequestSent(t=t, session=sid, turn=1, target_tokens=4096, new_tokens_est=4096, body_bytes=1, due=t),
            ev.FirstToken(t=t + ttft, session=sid, turn=1),
            ev.TokenTimes(t=t + ttft + 1, session=sid, turn=1, times=[t + ttft, t + ttft + 1]),
            ev.TurnDone(t=t + ttft + 1, session=sid, turn=1, status="ok", prompt_tokens=4096, completion_tokens=2),
        ]
    events.append(ev.RunEnded(t=100.0, status="done", exit_code=0))
    return Recording(header=header, events=events)


def test_percentiles_come_from_the_pooled_turns_never_from_the_shards_percentiles():
    """Shard 0's turns waited 1, 2, 3 s, shard 1's 10 and 20 s: the run's median is 3 s (of all five), not the
    mean of the shards' medians (8.5 s); its p99 is the pooled quantile likewise."""
    a, b = open_loop_shard(0, [1.0, 2.0, 3.0]), open_loop_shard(1, [10.0, 20.0])
    merged = merge_shards([("a.jsonl", a), ("b.jsonl", b)]).recording
    state = RunState(merged.header)
    for e in merged.events:
        state.apply(e)
    pooled = sorted([1.0, 2.0, 3.0, 10.0, 20.0])
    rep = build_report(state)
    assert rep.open_loop is not None and rep.open_loop.ttft_from_send_p50_s == pytest.approx(median(pooled)) == 3.0
    assert rep.open_loop.arrived == 5
    point = capacity_point(state)
    assert point is not None
    per_128k = 131072 / 4096
    assert point.ttft_p50_per_128k_s == pytest.approx(quantile(pooled, 0.5) * per_128k)
    assert point.ttft_p99_per_128k_s == pytest.approx(quantile(pooled, 0.99) * per_128k)
    assert point.ttft_p99_per_128k_s != pytest.approx((quantile([1, 2, 3], 0.99) + quantile([10, 20], 0.99)) / 2)


def test_the_worst_end_and_a_missing_shard():
    """A shard that failed makes the run failed (its exit code, its error named by shard); a shard missing is
    said, and the run is what the others recorded; a shard with no end leaves the run without one."""
    a, b = open_loop_shard(0, [1.0]), open_loop_shard(1, [2.0])
    b.events[-1] = ev.RunEnded(t=90.0, status="crashed", exit_code=3, error="out of memory")
    merged = merge_shards([("a.jsonl", a), ("b.jsonl", b)])
    end = merged.recording.events[-1]
    assert isinstance(end, ev.RunEnded) and (end.status, end.exit_code, end.error) == (
        "crashed",
        3,
        "shard 1/2: out of memory",
    )
    assert end.t == 100.0 and merged.notes == []  # a's end; b's (its clock started 1 s later) was at 91 s
    alone = merge_shards([("b.jsonl", open_loop_shard(1, [2.0]))])
    assert alone.notes == ["merged shards 1 of 2 (1 missing: shard 0); the run is what the others recorded"]
    assert isinstance(alone.recording.events[0], ev.Notice) and alone.recording.header.sessions == 5  # the run's
    b.events.pop()
    unended = merge_shards([("a.jsonl", a), ("b.jsonl", b)])
    assert not any(isinstance(e, ev.RunEnded) for e in unended.recording.events)
    assert unended.notes == ["shard 1 of 2 has no end (killed, or still running): the merged run has none either"]


def closed_loop_shard(i: int, sessions: list[str], planned_at: float) -> Recording:
    """Shard i of 2 of a closed-loop run of 4 sessions, its sessions planned at `planned_at`, one turn each."""
    header = ev.Header(
        rampwatch_version="t",
        command=["rampwatch"],
        mode="run",
        server="http://s",
        sessions=4,
        salt="x",
        seed=7,
        shard=(i, 2),
        started_at="2026-12-03T20:00:00.000+00:00",
    )
    events: list[ev.AnyEvent] = [
        ev.SessionPlanned(t=planned_at, session=sid, schedule=[1000], salt=f"x-{sid}") for sid in sessions
    ]
    for sid in sessions:
        events += [
            ev.RequestSent(t=1.0, session=sid, turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=1),
            ev.FirstToken(t=1.5, session=sid, turn=1),
            ev.TurnDone(t=2.0, session=sid, turn=1, status="ok", prompt_tokens=1000, completion_tokens=1),
        ]
    return Recording(header=header, events=[*events, ev.RunEnded(t=3.0, status="done", exit_code=0)])


def test_a_closed_loops_sessions_are_planned_in_their_order():
    """Shard 1 planned s2 and s4 before shard 0 planned s1 and s3: the run plans s1, s2, s3, s4 (as one driver
    does, and as --warmup N's first N conversations count), at the earliest plan's time."""
    a, b = closed_loop_shard(0, ["s1", "s3"], 0.010), closed_loop_shard(1, ["s2", "s4"], 0.001)
    merged = merge_shards([("a.jsonl", a), ("b.jsonl", b)]).recording
    planned = [e for e in merged.events if isinstance(e, ev.SessionPlanned)]
    assert [(e.session, e.t, e.worker) for e in planned] == [
        ("s1", 0.001, 0),
        ("s2", 0.001, 1),
        ("s3", 0.001, 0),
        ("s4", 0.001, 1),
    ]
    state = RunState(merged.header)
    for e in merged.events:
        state.apply(e)
    assert [s.id for s in build_report(state).sessions] == ["s1", "s2", "s3", "s4"]
    assert [state.sessions[sid].order for sid in ("s1", "s2", "s3", "s4")] == [1, 2, 3, 4]


def test_one_baseline_a_run():
    """--one-shot: every shard ran the baseline (none knows it is not alone); the lowest shard's is the run's, the
    others' are left out, and said."""

    def with_baseline(rec: Recording, ttft: float) -> Recording:
        t = 50.0
        baseline = [
            ev.SessionPlanned(t=t, session="one-shot", schedule=[4096], salt="z", role="one-shot"),
            ev.RequestSent(t=t, session="one-shot", turn=1, target_tokens=4096, new_tokens_est=4096, body_bytes=1),
            ev.FirstToken(t=t + ttft, session="one-shot", turn=1),
            ev.TurnDone(t=t + ttft, session="one-shot", turn=1, status="ok", prompt_tokens=4096, completion_tokens=1),
        ]
        return msgspec.structs.replace(rec, events=baseline + rec.events)

    a, b = with_baseline(open_loop_shard(0, [1.0]), 4.0), with_baseline(open_loop_shard(1, [2.0]), 9.0)
    merged = merge_shards([("b.jsonl", b), ("a.jsonl", a)])
    assert merged.notes == ["shard 1 also ran the one-shot baseline: shard 0's is the run's, theirs are left out"]
    done = [e for e in merged.recording.events if isinstance(e, ev.TurnDone) and e.session == "one-shot"]
    assert [e.t for e in done] == [54.0]
    started = {e.worker: e.sessions for e in merged.recording.events if isinstance(e, ev.WorkerStarted)}
    assert started == {0: ["one-shot", "s1"], 1: ["s2"]}


def at(rec: Recording, start_at: float) -> Recording:
    return msgspec.structs.replace(rec, header=msgspec.structs.replace(rec.header, start_at=start_at))


def test_what_is_not_one_runs_shards_is_refused():
    a, b = open_loop_shard(0, [1.0]), open_loop_shard(1, [2.0])
    cases = [
        ([a, msgspec.structs.replace(b, header=msgspec.structs.replace(b.header, shard=None))], "not a shard"),
        ([a, msgspec.structs.replace(b, header=msgspec.structs.replace(b.header, shard=(1, 3)))], "is shard 1/3"),
        ([a, open_loop_shard(1, [2.0], salt="y")], "has salt y"),
        ([a, open_loop_shard(1, [2.0], sessions=6)], "is of a run of 6 sessions"),
        ([a, a], "are both shard 0/2"),
        ([a, msgspec.structs.replace(b, events=a.events)], "session s1 is in"),
        ([a, msgspec.structs.replace(b, header=msgspec.structs.replace(b.header, started_at=""))], "no start time"),
        (  # two Job runs of one seed: their --start-at tells them apart
            [at(a, 1_800_000_000.0), at(b, 1_800_003_600.0)],
            "started at --start-at 1800003600, p0.jsonl at 1800000000",
        ),
    ]
    for parts, said in cases:
        with pytest.raises(BadInput, match=said):
            merge_shards([(f"p{k}.jsonl", p) for k, p in enumerate(parts)])


def test_the_command_line_says_no_in_one_line(whole, tmp_path):
    parts = write_shards(tmp_path, split(read_recording(whole)))
    others = write_shards(tmp_path, split(read_recording(whole), salt="other"), stem="other")
    cases = [
        (["report", "--merge", str(whole), str(parts[1])], "not a shard"),
        (["report", "--merge", str(parts[0]), str(others[1])], "not shards of one run"),
        (["report", "--merge", str(parts[0]), str(parts[0])], "are both shard 0/3"),
        (["report", str(whole), "--merge", str(parts[0])], "not both"),
        (["report"], "report needs a recording, or --merge"),
        (["export", "--merge", str(parts[0]), str(others[0]), "--svg", str(tmp_path / "x.svg")], "not shards of one"),
        (["compare", "--merge", str(tmp_path / "nope.jsonl")], "no such recording"),
    ]
    for args, said in cases:
        p = rw(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and said in p.stderr, (args, p.stderr)


def test_a_missing_shard_is_reported_with_a_note(whole, tmp_path):
    parts = write_shards(tmp_path, split(read_recording(whole)))
    p = rw("report", "--merge", str(parts[0]), str(parts[2]), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert "merged shards 0,2 of 3 (1 missing: shard 1)" in p.stderr
    rep = json.loads(p.stdout)
    assert [s["id"] for s in rep["sessions"]] == ["s1", "s3"] and rep["run"]["sessions"] == 2  # those recorded


def test_compare_and_export_read_a_merged_run(whole, tmp_path):
    """compare: each --merge is one more run, after the RUNs; --baseline may name one of its parts. export draws
    the merged run."""
    parts = write_shards(tmp_path, split(read_recording(whole)))
    p = rw("compare", str(whole), "--merge", *map(str, parts), "--baseline", parts[1].name, "--format", "json")
    assert p.returncode == 0, p.stderr
    cmp = json.loads(p.stdout)
    assert [r["path"] for r in cmp["runs"]] == [str(whole), " + ".join(map(str, parts))]
    assert cmp["baseline"] == cmp["runs"][1]["label"] == "sim-model@rampwatch-sim #2"
    one, merged = ({k: v for k, v in r.items() if k not in ("label", "path")} for r in cmp["runs"])
    approx(merged, one)
    svg = tmp_path / "merged.svg"
    p = rw("export", "--merge", *map(str, parts), "--svg", str(svg))
    assert p.returncode == 0, p.stderr
    assert svg.read_text().startswith("<svg") and "s3" in svg.read_text()


# Float fields that are not instants on the run clock or durations of the run: never shifted, never scaled.
NOT_RUN_TIMES = {
    ("ClientLag", "p50_ms"),
    ("ClientLag", "p99_ms"),
    ("ClientLag", "max_ms"),
    ("ClientLag", "own_max_ms"),
    ("ClientLag", "cpu_s"),
    ("WorkerClock", "offset_s"),
    ("WorkerClock", "uncertainty_s"),
}


def test_every_time_an_event_carries_is_shifted_or_said_not_to_be():
    """An event kind that gains a time field must say whether a merge shifts it (an instant on the run clock)
    or not (a duration, a figure in ms): drivers/model/modelled.py lists both."""
    tables = (modelled._INSTANTS, modelled._DURATIONS)
    listed = {(kind.__name__, f) for table in tables for kind, fields in table.items() for f in fields}
    for kind in typing.get_args(ev.AnyEvent):
        for name, hint in typing.get_type_hints(kind).items():
            if name != "t" and "float" in str(hint) and not str(hint).startswith(("list", "dict")):
                assert (kind.__name__, name) in listed | NOT_RUN_TIMES, (kind.__name__, name)
    sent = ev.RequestSent(t=1.0, session="s1", turn=1, target_tokens=1, new_tokens_est=1, body_bytes=1, due=0.5)
    assert modelled.shifted(sent, 2.0) == msgspec.structs.replace(sent, t=3.0, due=2.5)
    lag = ev.ClientLag(t=1.0, p50_ms=1.0, p99_ms=2.0, max_ms=9.0, busy=[(0.5, 0.6)])
    assert modelled.shifted(lag, 2.0, worker=1) == msgspec.structs.replace(lag, t=3.0, busy=[(2.5, 2.6)], worker=1)
    times = ev.TokenTimes(t=1.0, session="s1", turn=1, times=[0.5, 1.0])
    assert modelled.shifted(times, 1.0).times == [1.5, 2.0]
    done = ev.TurnDone(t=1.0, session="s1", turn=1, status="ok", queued_s=0.25)
    assert modelled.shifted(done, 1.0).queued_s == 0.25  # a duration: as it was
