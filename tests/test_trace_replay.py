"""--trace (issue 35): a trace in each format replayed against the simulated engine as a user runs it: its
sessions and turns as the trace says, every prompt within 2% of its input_length (16 tokens for short ones), and
the server's prefix cache supplying exactly what the trace's shared blocks allowed (cache efficiency 1.00) where
the trace names its blocks; bad input is one line and exit 2, before anything is sent."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rampwatch.drivers.model.trace import collect_sessions
from rampwatch.drivers.run.trace_read import open_trace
from rampwatch.drivers.sim.profiles import make_profile
from tests.conftest import report_json, rw
from tests.simhost import ThreadedSim

TRACES = Path(__file__).resolve().parent / "data" / "traces"
# (file, the simulated engine's profile and block size for it, whether the trace names its blocks itself)
FORMATS = [
    ("mooncake.jsonl", "fast", 64, True),
    ("bailian.csv", "fast", 16, True),
    ("bailian.jsonl", "fast", 16, True),
    ("agentic.jsonl.gz", "fast", 64, True),
    ("aiperf.jsonl", "fast", 16, False),
    ("recording.jsonl", "fast", 16, False),
]


def replay(trace: Path, record: Path, profile: str, block: int, *more: str) -> dict:
    p = rw(
        "demo", "--headless", "--profile", profile, "--block-size", str(block), "--time-scale", "20",
        "--gpus", "0", "--trace", str(trace), "--record", str(record), *more,
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    return report_json(record)


# Serial: the engine's hits follow the order the requests ran, the ideal the trace's; on a loaded machine a late
# send can let a later request that shares blocks run first (a CI pass found 288 cached tokens of an ideal 256).
@pytest.mark.serial
@pytest.mark.parametrize(("name", "profile", "block", "named"), FORMATS, ids=[f[0] for f in FORMATS])
def test_a_trace_replays_as_its_sessions_with_its_sizes_and_its_reuse(tmp_path, name, profile, block, named):
    trace = TRACES / name
    expected = {s.id: s.turns for s in collect_sessions(open_trace(trace).requests())}
    rep = replay(trace, tmp_path / "replay.jsonl", profile, block)
    assert rep["run"]["trace"]["format"] == open_trace(trace).format and rep["run"]["trace"]["skipped"] == {}
    sessions = {s["id"]: s["turns"] for s in rep["sessions"]}
    assert set(sessions) == set(expected)
    for sid, rows in sessions.items():
        assert [r["turn"] for r in rows] == [t.turn for t in expected[sid]], sid
        for row, want in zip(rows, expected[sid]):
            assert row["error"] is None, row
            slack = max(16, 0.02 * want.input_length)
            assert abs(row["context_tokens"] - want.input_length) <= slack, (sid, row["turn"], want.input_length)
            assert row["ideal_cached_tokens"] == want.ideal_cached
            if named:  # the engine's cache gave exactly what the shared blocks allowed
                assert row["cached_tokens"] == want.ideal_cached, (sid, row["turn"], row, want)
            else:  # derived blocks: a partial block grown full is no ideal hit, the engine may reuse its start
                assert want.ideal_cached <= row["cached_tokens"] <= want.ideal_cached + block, (sid, row, want)
    reuse = rep["reuse"]["run"]
    assert reuse["ideal_tokens"] > 0
    if named:
        assert reuse["efficiency"] == 1.0 and rep["reuse"]["shortfalls"] == []


def test_the_replay_shows_the_ideal_beside_the_measured_everywhere(tmp_path):
    record = tmp_path / "mooncake.jsonl"
    p = rw(
        "demo", "--headless", "--profile", "fast", "--block-size", "64", "--time-scale", "20", "--gpus", "0",
        "--trace", str(TRACES / "mooncake.jsonl"), "--record", str(record),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "cached 1,024 of ideal 1,024 (100%)" in p.stdout  # the Events line
    assert "reuse: cached 13,312 of the 13,312 prompt tokens the trace allowed (cache efficiency 100%)" in p.stdout
    s1 = next(line for line in p.stdout.splitlines() if line.startswith("s1: "))
    assert "turns, TTFT sum" in s1 and "needle" not in s1  # a trace asks no needle: no "needle 0/3"
    text = rw("report", str(record), "--format", "md").stdout
    assert "| ideal | reuse eff |" in text and "| 1.0K | 100% |" in text
    md = rw("compare", str(record), "--format", "md").stdout
    assert "cache eff" in md and "100%" in md


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--trace", "/no/such/trace.jsonl"], "no such trace: /no/such/trace.jsonl"),
        (["--trace", str(TRACES / "mooncake.jsonl"), "--trace-format", "bailian"], "mooncake.jsonl"),
        (["--trace", str(TRACES / "mooncake.jsonl"), "--shared-prefix", "1k"], "--shared-prefix does not apply"),
        (["--trace-kv-tokens", "1m"], "needs --trace FILE"),
        (["--trace", str(TRACES / "agentic.jsonl.gz")], "max_model_len"),  # 200K tokens on a 40K-token engine
    ],
)
def test_bad_trace_input_is_one_line_and_exit_2(tmp_path, flags, says):
    p = rw("demo", "--headless", "--profile", "tiny", "--gpus", "0", "--no-record", *flags)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.strip() and "receiving OTLP" not in line]
    assert len(lines) == 1 and says in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_a_bad_row_stops_the_run_before_anything_is_sent_or_is_skipped_and_counted(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = (TRACES / "mooncake.jsonl").read_text().splitlines()
    bad.write_text("\n".join([*good[:5], '{"timestamp": 99999999, "input_length": -5, "output_length": 8}', *good[5:]]))
    p = rw("demo", "--headless", "--profile", "fast", "--gpus", "0", "--trace", str(bad), "--no-record")
    assert p.returncode == 2 and "turn 1" not in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert "bad.jsonl: line 6" in p.stderr
    record = tmp_path / "skipped.jsonl"
    rep = replay(bad, record, "fast", 64, "--trace-skip-bad")
    assert sum(rep["run"]["trace"]["skipped"].values()) >= 1
    assert sum(len(s["turns"]) for s in rep["sessions"]) == 10


def timing_trace(path: Path) -> Path:
    """Two sessions of three turns, 1.5 s apart in the trace, each turn growing its session's blocks."""
    rows = [
        {"session_id": f"s{s}", "timestamp": s * 300 + k * 1500, "input_length": 300 + 200 * k, "output_length": 20,
         "hash_ids": list(range(s * 100, s * 100 + (300 + 200 * k + 63) // 64))}
        for s in range(2) for k in range(3)
    ]  # fmt: skip
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sends_and_ends(record: Path) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(session, turn) -> (due, sent, done) on the recording's clock."""
    out: dict[tuple[str, int], list[float]] = {}
    for line in record.read_text().splitlines():
        e = json.loads(line)
        if e.get("type") == "RequestSent":
            out[(e["session"], e["turn"])] = [e["due"], e["t"], math.nan]
        elif e.get("type") == "TurnDone":
            out[(e["session"], e["turn"])][2] = e["t"]
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


@pytest.mark.parametrize("timing", ["session", "open"])
def test_trace_timing_and_speed_say_when_each_turn_is_due(tmp_path, timing):
    """session: a later turn is due the trace's gap (1.5 s), divided by the speed (2) and the demo's time scale
    (5), after the previous reply ended; open: at its own time in the trace, so 0.15 s after the previous turn
    was due, reply or not."""
    record = tmp_path / f"{timing}.jsonl"
    p = rw(
        "demo", "--headless", "--profile", "fast", "--block-size", "64", "--time-scale", "5", "--gpus", "0",
        "--trace", str(timing_trace(tmp_path / "t.jsonl")), "--trace-block-size", "64", "--trace-timing", timing,
        "--trace-speed", "2", "--record", str(record),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "(the trace at 2x)" in p.stdout
    turns = sends_and_ends(record)
    assert len(turns) == 6
    gap = 1.5 / 2 / 5
    for (sid, turn), (due, sent, _) in turns.items():
        assert sent >= due - 0.002, (sid, turn)
        if turn == 1:
            continue
        before_due, _, before_done = turns[(sid, turn - 1)]
        start = before_done if timing == "session" else before_due
        assert due - start == pytest.approx(gap, abs=0.01), (sid, turn, due, start)
    assert report_json(record)["run"]["trace"]["timing"] == timing


def test_trace_warm_reuses_the_trace_s_salt_and_a_fresh_run_does_not(tmp_path):
    """Against one server, a second run of the same trace hits the first run's blocks only with --trace-warm."""
    trace = timing_trace(tmp_path / "t.jsonl")
    with ThreadedSim(make_profile("fast", block_size=64)) as server:

        def first_turn_cached(name: str, *flags: str) -> int:
            record = tmp_path / name
            p = rw("run", server.url, "--headless", "--trace", str(trace), "--trace-block-size", "64",
                   "--gpu", "none", "--record", str(record), *flags)  # fmt: skip
            assert p.returncode == 0, p.stderr[-2000:]
            rows = {s["id"]: s["turns"] for s in report_json(record)["sessions"]}
            return rows["s0"][0]["cached_tokens"]

        assert first_turn_cached("cold.jsonl", "--trace-warm") == 0
        assert first_turn_cached("warm.jsonl", "--trace-warm") == 256  # its 300 tokens' 4 full blocks of 64
        assert first_turn_cached("fresh.jsonl") == 0


def test_corpus_words_make_the_blocks_and_the_sizes_still_hold(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(["lantern harbor meadow copper violet summit river falcon"] * 50))
    record = tmp_path / "corpus.jsonl"
    p = rw(
        "demo", "--headless", "--profile", "fast", "--block-size", "64", "--time-scale", "20", "--gpus", "0",
        "--trace", str(timing_trace(tmp_path / "t.jsonl")), "--trace-block-size", "64", "--corpus", str(corpus),
        "--record-text", "--record", str(record),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    events = [json.loads(line) for line in record.read_text().splitlines()]
    sent = [e["text"] for e in events if e.get("type") == "RequestSent" and e.get("text")]
    words = {"lantern", "harbor", "meadow", "copper", "violet", "summit", "river", "falcon"}
    # (the first word may be cut where the prompt's BOS took the first block's first token)
    assert sent and all(set(t.split()[1:]) <= words for t in sent), sent[0][:200]
    for s in report_json(record)["sessions"]:
        for row in s["turns"]:
            assert row["cached_tokens"] == row["ideal_cached_tokens"]


def test_sweep_replays_the_trace_at_each_speed(tmp_path):
    trace = timing_trace(tmp_path / "t.jsonl")
    sweep = tmp_path / "speeds.sweep.json"
    with ThreadedSim(make_profile("fast", block_size=64)) as server:
        p = rw("sweep", server.url, "--trace", str(trace), "--trace-block-size", "64", "--trace-speed", "1,4",
               "--slo", "ttft=5s", "--gpu", "none", "--record", str(sweep), timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "one point per trace speed" in p.stdout and "4x" in p.stdout
    listed = json.loads(sweep.read_text())
    assert listed["trace_speeds"] == [1.0, 4.0] and len(listed["runs"]) == 2
    speeds = [report_json(tmp_path / run)["run"]["trace"]["speed"] for run in listed["runs"]]
    assert speeds == [1.0, 4.0]
    bad = rw("sweep", "http://127.0.0.1:9", "--trace", str(trace), "--find-max", "--slo", "ttft=1s")
    assert bad.returncode == 2 and "--trace-speed" in bad.stderr


def one_session(path: Path, gap_ms: int, turns: int) -> Path:
    """A Mooncake trace of one session, its turns `gap_ms` apart, each a block of its own."""
    rows = [
        {"session_id": "a", "timestamp": gap_ms * k, "input_length": 200 + 100 * k, "output_length": 8,
         "hash_ids": [k + 1]}
        for k in range(turns)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_trace_whose_sessions_start_at_once_still_sweeps(tmp_path):
    """No rate to offer (one start): each point still runs and says its sessions arrived all at once."""
    trace = one_session(tmp_path / "one.jsonl", gap_ms=400, turns=3)
    with ThreadedSim(make_profile("fast")) as server:
        p = rw("sweep", server.url, "--trace", str(trace), "--trace-speed", "1,2", "--gpu", "none", "--no-record")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "arrivals: all at once (the trace at 2x)" in p.stdout


def test_the_time_limit_ends_a_session_whose_next_turn_is_due_after_it(tmp_path):
    """A 60 s gap and --time-limit 10s (from the run's start, its setup included): the second turn is never sent,
    and the run ends by the limit, not after the gap."""
    trace = one_session(tmp_path / "gap.jsonl", gap_ms=60_000, turns=2)
    record = tmp_path / "limit.jsonl"
    with ThreadedSim(make_profile("fast")) as server:
        p = rw("run", server.url, "--headless", "--trace", str(trace), "--time-limit", "10s", "--grace", "0",
               "--gpu", "none", "--record", str(record), timeout=30)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert [t["turn"] for s in report_json(record)["sessions"] for t in s["turns"]] == [1]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_turn_given_as_text_is_sent_as_written_with_its_conversation(tmp_path, api):
    """AIPerf multi_turn `text` turns (chat-b of the test trace): each turn's message exactly as the trace has it,
    after the session's earlier messages and the replies they got, so the context grows by each reply."""
    record = tmp_path / f"text-{api}.jsonl"
    p = rw(
        "demo", "--headless", "--profile", "fast", "--time-scale", "20", "--gpus", "0", "--trace-api", api,
        "--trace", str(TRACES / "aiperf.jsonl"), "--record-text", "--record", str(record),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    events = [json.loads(line) for line in record.read_text().splitlines()]
    sent = [e["text"] for e in events if e.get("type") == "RequestSent" and e.get("session") == "chat-b"]
    written = [t["text"] for t in json.loads((TRACES / "aiperf.jsonl").read_text().splitlines()[1])["turns"]]
    assert sent == written
    turns = {s["id"]: s["turns"] for s in report_json(record)["sessions"]}["chat-b"]
    first, second = turns
    assert second["context_tokens"] > first["context_tokens"] + first["output_tokens"], (first, second)


async def test_a_text_session_resumed_elsewhere_sends_what_it_would_have_sent():
    """--workers-restart with a text trace: what each turn adds to the conversation goes to the coordinator
    (keep_said), and a session resumed from it on another worker (LocalSessions.resume) sends its next turn
    byte for byte as the lost worker's session would have, the reply it had got included."""
    import asyncio

    import httpx

    from rampwatch.drivers.client.streamer import TurnOptions
    from rampwatch.drivers.client.trace_prompt import Atoms, Template, TracePrompts
    from rampwatch.drivers.client.trace_session import TraceSessionRunner
    from rampwatch.drivers.model.clock import RunClock
    from rampwatch.drivers.model.trace import TraceRequest
    from rampwatch.drivers.run.trace_run import LocalSessions

    said = ["Tell me about the sea.", "And the mountains?"]
    requests = [TraceRequest(session="c", turn=k, due_s=0.0, input_length=16, output_length=8, hash_ids=[], text=t)
                for k, t in enumerate(said, start=1)]  # fmt: skip
    prompts = TracePrompts(Atoms(words=(" a",)), "salt", 64, Template(), chat=True)
    bodies: dict[str, list[bytes]] = {"lost": [], "resumed": []}
    kept: list[list[tuple[str, str]]] = []

    with ThreadedSim(make_profile("fast")) as sim:
        async with httpx.AsyncClient() as client:

            def runner(name: str) -> TraceSessionRunner:
                opts = TurnOptions(model="sim-model")
                r = TraceSessionRunner("c", prompts, client, sim.url, {}, opts, lambda e: None, RunClock(), 0.0)
                r.keep_said = kept.append
                send = r.send

                async def spy(turn, body, *rest):  # noqa: ANN001, ANN002, ANN202
                    bodies[name].append(b"".join(body))
                    return await send(turn, body, *rest)

                r.send = spy
                return r

            lost = runner("lost")
            for request in requests:
                lost.turns.put_nowait(request)
            lost.turns.put_nowait(None)
            assert await lost.run()
            assert [[role for role, _ in k] for k in kept] == [["user", "assistant"]] * 2
            assert kept[0][0] == ("user", said[0]) and kept[0][1][1]  # the reply, as the worker got it

            tasks: list[asyncio.Task[bool]] = []
            here = LocalSessions(lambda sid, k, origin: runner("resumed"), lambda e: None, tasks)
            here.resume(1, "c", 0.0, None, kept[0])
            here.turn(requests[1])
            here.end("c")
            assert await asyncio.gather(*tasks) == [True]
    assert bodies["resumed"] == bodies["lost"][1:]
    assert len(kept) == 3 and kept[2][0] == ("user", said[1]) and [r for r, _ in kept[2]] == ["user", "assistant"]
