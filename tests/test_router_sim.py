"""Behind a router (issue 37), against `rampwatch sim --topology router` run as a user runs it: which replica
served each turn (from the replicas' spans, or their counters), whether each session stayed, the router's own
requests per worker, and the moves a router restart causes."""

from __future__ import annotations

import pytest

from tests.conftest import focus_table, free_port, report_json, rw, sim_process


def router_run(url: str, *extra: str, record, otlp: int | None = None, sessions: int = 2) -> dict:
    """`rampwatch run` against the simulated router at `url` (its replicas on the next ports, named r0, r1, ...
    as the sim's own suggested line names them), headless, recorded; the report as JSON."""
    port = int(url.rsplit(":", 1)[1])
    flags = ["--metrics-url", f"router:router={url}/metrics", "--header", "x-session-id: {session}"]
    flags += [a for k in range(2) for a in ("--metrics-url", f"r{k}=http://127.0.0.1:{port + 1 + k}/metrics")]
    flags += ["--sessions", str(sessions), "--schedule", "2k,4k,6k,8k", "--output-tokens", "8"]
    flags += ["--otlp", str(otlp)] if otlp else []
    p = rw("run", url, *flags, *extra, "--headless", "--gpu", "none", "--record", str(record), timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return report_json(record)


def sim_args(policy: str, otlp: int | None, *extra: str) -> list[str]:
    args = ["--topology", "router", "--router-policy", policy, "--profile", "tiny", *extra]
    return args + (["--otlp-traces-endpoint", f"http://127.0.0.1:{otlp}/v1/traces"] if otlp else [])


def served(rep: dict) -> dict[str, list[tuple[str | None, str | None]]]:
    return {s["id"]: [(t["served_by"], t["served_by_source"]) for t in s["turns"]] for s in rep["sessions"]}


def test_consistent_hash_keeps_every_session_on_one_replica_named_by_its_spans(tmp_path):
    otlp = free_port()
    with sim_process(*sim_args("consistent_hash", otlp), ports=3) as (_, url):
        rep = router_run(url, record=tmp_path / "hash.jsonl", otlp=otlp, sessions=4)
    by = served(rep)
    assert len(by) == 4
    for sid, turns in by.items():
        assert len(turns) == 4 and {src for _, src in turns} == {"span"}, (sid, turns)
        assert len({b for b, _ in turns}) == 1 and turns[0][0] in ("r0", "r1"), (sid, turns)
    for s in rep["sessions"]:
        assert s["affinity"]["share"] == 1.0 and s["affinity"]["moves"] == []
        # On one replica the prefix cache holds the session's history: hit rates as a single server's.
        assert all(t["hit_rate"] > 0.3 for t in s["turns"][1:]), s["turns"]
    assert rep["affinity"] == {
        "sessions": 4,
        "served_turns": 16,
        "held_turns": 16,
        "share": 1.0,
        "moved_sessions": 0,
        "moves": 0,
        "ambiguous_turns": 0,
    }
    router = next(f for f in rep["servers"] if f["name"] == "router")
    assert router["role"] == "router" and sum(router["workers"].values()) == 16
    assert set(router["workers"]) <= {"r0", "r1"}  # the workers by the names of the endpoints at their URLs
    total = rep["servers_total"]  # the model servers' alone, as the Server panel's total row
    assert total["engine"] == "vllm" and total["prompt_tokens"] == sum(
        f["prompt_tokens"] for f in rep["servers"] if f["role"] == "both"
    )


@pytest.fixture(scope="module")
def round_robin(tmp_path_factory) -> tuple[dict, object]:
    """One session behind the round-robin router, its spans received: (its report, its recording)."""
    otlp = free_port()
    record = tmp_path_factory.mktemp("rr") / "rr.jsonl"
    with sim_process(*sim_args("round_robin", otlp), ports=3) as (_, url):
        rep = router_run(url, record=record, otlp=otlp, sessions=1)
    return rep, record


def test_round_robin_moves_a_session_on_every_turn_and_the_report_says_which(round_robin):
    """Round robin is the router's, not the session's: a lone session alternates replicas on every turn (several
    sessions interleave, so which of them moves depends on who sent first)."""
    rep, record = round_robin
    (s,) = rep["sessions"]
    turns = served(rep)["s1"]
    assert turns == [("r0", "span"), ("r1", "span"), ("r0", "span"), ("r1", "span")]
    assert [(m["turn"], m["from_backend"], m["to_backend"]) for m in s["affinity"]["moves"]] == [
        (2, "r0", "r1"),
        (3, "r1", "r0"),
        (4, "r0", "r1"),
    ]
    # Back on r0 at turn 3, its turn-1 prompt is there; on r1 at turn 2 nothing was.
    assert s["affinity"]["moves"][0]["hit_after"] == 0.0 and s["affinity"]["moves"][1]["hit_after"] > 0.2
    assert s["affinity"]["share"] == 0.5 and rep["affinity"]["moves"] == 3
    text = rw("report", str(record)).stdout
    assert "1 session, affinity 50% (2/4 turns on the first backend)" in text
    assert "s1 moved 3 times: turn 2 r0→r1, hit 0%→0%; turn 3 r1→r0" in text
    assert "router router: r0 2 · r1 2 requests" in text
    table = rw("report", str(record), "--format", "md").stdout
    assert "| served by |" in table and "| r1 |" in table
    # compare: each run's affinity, and the backend of each turn beside its TTFT.
    again = record.with_name("again.jsonl")
    again.write_bytes(record.read_bytes())
    cmp = rw("compare", str(record), str(again), "--format", "md").stdout
    assert "| affinity |" in cmp and "| 50% (1 moved) |" in cmp and "served by |" in cmp
    assert "| r0 | r0 |" in cmp and "| r1 | r1 |" in cmp


def folded(record) -> object:
    from rampwatch.drivers.model.state import RunState
    from rampwatch.drivers.run.recording import read_recording

    recording = read_recording(record)
    state = RunState(recording.header)
    for e in recording.events:
        state.apply(e)
    return state


def test_the_sessions_panel_marks_a_session_that_moved(round_robin):
    from rampwatch.tui.widgets.sessions import session_row

    state = folded(round_robin[1])
    assert session_row(state.sessions["s1"], state.t, 80).plain.startswith("s1⇄3")


def test_the_server_panel_gives_the_router_a_row_of_requests_per_worker(round_robin):
    from rampwatch.tui.widgets.server import endpoint_table

    state = folded(round_robin[1])
    answered = [ep for ep in state.endpoints.values() if ep.last_sample_t is not None]
    rows = [line.plain for line in endpoint_table(state, answered, 100)]
    assert any(r.startswith("router") and "requests r0 2 · r1 2" in r for r in rows), rows
    assert len({len(r) for r in rows if not r.startswith("router")}) == 1, rows  # the head as wide as each row
    assert state.server.values.get("router_requests") is None  # the total row is the model servers' alone


def test_the_timeline_picture_marks_each_turn_by_its_backend_and_the_moves(round_robin):
    import re

    from rampwatch.drivers.present.timeline_picture import timeline_svg

    svg = timeline_svg(folded(round_robin[1]))
    marks = re.findall(r'<text class="backend( moved)?"[^>]*>(r\d)</text>', svg)
    assert marks == [("", "r0"), (" moved", "r1"), (" moved", "r0"), (" moved", "r1")]


async def test_the_focus_screen_says_which_replica_served_each_turn(round_robin):
    from rampwatch.drivers.run.recording import read_recording
    from rampwatch.tui.sources import ReplaySource

    heads, cells = await focus_table(ReplaySource(read_recording(round_robin[1])), (200, 40))
    col = heads.index("served by")
    assert [row[col] for row in cells] == ["r0", "r1", "r0", "r1"]


@pytest.mark.serial  # a turn is told apart by its counters only when its think time outlasts a scrape interval
def test_counters_name_the_replica_of_turns_apart_and_call_overlapping_turns_ambiguous(tmp_path):
    with sim_process(*sim_args("round_robin", None), ports=3) as (_, url):
        alone = router_run(
            url, "--think-time", "1s", "--scrape-interval", "0.1", record=tmp_path / "a.jsonl", sessions=1
        )
        both = router_run(url, "--lockstep", "--scrape-interval", "0.1", record=tmp_path / "b.jsonl")
    turns = served(alone)["s1"]
    assert [src for _, src in turns] == ["counters"] * 4, turns
    assert all(a[0] != b[0] for a, b in zip(turns, turns[1:])), turns  # round robin: every turn on the other
    assert alone["affinity"]["moves"] == 3
    # Lockstep: each turn of s1 and s2 in one window, one on each replica. Neither is guessed.
    assert {t for turns in served(both).values() for t in turns} == {(None, "ambiguous")}
    assert both["affinity"]["ambiguous_turns"] == 8
    assert "8 turns ambiguous" in rw("report", str(tmp_path / "b.jsonl")).stdout


def test_a_router_restarted_with_a_changed_ring_moves_every_session_and_the_report_says_where(tmp_path):
    """Restarted after 4 requests (both sessions' turns 1 and 2, lockstep): its ring rotated, turns 3 and 4 land
    on the other replica. Its counters start again from zero; the router row's counts do not go back."""
    otlp = free_port()
    args = sim_args("consistent_hash", otlp, "--router-restart-after", "4")
    with sim_process(*args, ports=3) as (_, url):
        rep = router_run(url, "--lockstep", record=tmp_path / "restart.jsonl", otlp=otlp)
    for s in rep["sessions"]:
        turns = [b for b, _ in served(rep)[s["id"]]]
        assert turns[0] == turns[1] != turns[2] == turns[3], turns
        (move,) = s["affinity"]["moves"]
        assert move["turn"] == 3 and move["from_backend"] == turns[0] and move["to_backend"] == turns[2]
        assert move["hit_before"] > 0.3 and move["hit_after"] < 0.05  # the new replica held none of its history
    assert rep["affinity"]["moved_sessions"] == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["sim", "--topology", "router", "--router-policy", "nope"], "--router-policy"),
        (["sim", "--router-policy", "round_robin"], "needs a router"),
        (["sim", "--topology", "router", "--pd"], "--pd"),
        (["demo", "--topology", "router:0", "--headless"], "--topology"),
        (["demo", "--router-restart-after", "3", "--headless"], "needs a router"),
    ],
)
def test_bad_router_values_are_refused_in_one_line(args, says):
    p = rw(*args)
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_trace_behind_round_robin_ties_its_reuse_shortfalls_to_the_moves(tmp_path):
    """A trace's turn served by another replica than its session's turn before finds none of its prefix there:
    the report's shortfall line says it moved."""
    record = tmp_path / "trace.jsonl"
    flags = ["--trace", "tests/data/traces/aiperf.jsonl", "--topology", "router", "--router-policy", "round_robin"]
    p = rw("demo", *flags, "--profile", "tiny", "--headless", "--record", str(record), timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = report_json(record)
    moved = {(s["id"], m["turn"]) for s in rep["sessions"] if s["affinity"] for m in s["affinity"]["moves"]}
    assert moved  # round robin over 2 replicas moves some session
    md = rw("report", str(record), "--format", "md").stdout.splitlines()
    short = next(x for x in md if x.startswith("- reuse fell furthest"))
    for s in rep["reuse"]["shortfalls"][:5]:
        said = f"{s['session']} turn {s['turn']} "
        assert said in short
        assert ((s["session"], s["turn"]) in moved) == ("moved r" in short.split(said, 1)[1].split(",")[0]), short
