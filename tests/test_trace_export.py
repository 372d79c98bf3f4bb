"""`rampwatch trace export` (issue 35): a recorded run written as a Mooncake or AIPerf multi_turn trace, and that
trace replayed by rampwatch gives back the run's sessions, its prompt sizes (within 2%), the gaps between a
session's turns (within 5%) and, for Mooncake, the prefixes its sessions shared; the hash ids re-blocked to 512
tokens as a chained hash; a plain ramp's export reads back as its sessions and turns; `trace info --svg/--html`
draws the trace; bad input is one line and exit 2."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rampwatch.drivers.model.trace import TraceRequest
from rampwatch.drivers.model.trace_export import AiperfSessions
from rampwatch.drivers.model.trace_reblock import Reblocker
from rampwatch.tui.cli import main
from tests.conftest import report_json, rw

TRACES = Path(__file__).resolve().parent / "data" / "traces"
DEMO = ("demo", "--headless", "--profile", "fast", "--block-size", "64", "--time-scale", "20", "--gpus", "0")


def replay(trace: Path, record: Path, *more: str) -> dict:
    p = rw(*DEMO, "--trace", str(trace), "--record", str(record), *more, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return report_json(record)


def export(source: Path, fmt: str, out: Path, *more: str) -> str:
    p = rw("trace", "export", str(source), "--format", fmt, "--output", str(out), *more)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    return p.stderr


def turns(rep: dict) -> dict[tuple[str, int], dict]:
    return {(s["id"], row["turn"]): row for s in rep["sessions"] for row in s["turns"]}


def sends(record: Path) -> dict[tuple[str, int], float]:
    """Each turn's first send, on the recording's (wall) clock."""
    out: dict[tuple[str, int], float] = {}
    for line in record.read_text().splitlines():
        e = json.loads(line)
        if e.get("type") == "RequestSent":
            out.setdefault((e["session"], e["turn"]), e["t"])
    return out


def dues(record: Path) -> dict[tuple[str, int], float]:
    """Each turn's due time, as the replayed trace set it, on the recording's (wall) clock."""
    return {(e["session"], e["turn"]): e["due"] for e in map(json.loads, record.read_text().splitlines())
            if e.get("type") == "RequestSent" and e.get("due") is not None}  # fmt: skip


def gaps(sent: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """The time from a session's turn to its next, by the later turn."""
    return {(sid, turn): t - sent[(sid, turn - 1)] for (sid, turn), t in sent.items() if (sid, turn - 1) in sent}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The Mooncake test trace (three sessions and two lone rows opening with the same two blocks) replayed
    against the simulated engine at 20x: the run to export."""
    record = tmp_path_factory.mktemp("export") / "original.jsonl"
    replay(TRACES / "mooncake.jsonl", record)
    return record


@pytest.mark.parametrize("fmt", ["mooncake", "aiperf"])
def test_an_exported_run_replays_as_it_ran(tmp_path, recorded, fmt):
    original = turns(report_json(recorded))
    out = tmp_path / f"export.{fmt}.jsonl"
    said = export(recorded, fmt, out)
    assert f"wrote {out}: 5 sessions, 10 requests as {fmt}" in said
    # The export's times are the run's sends as modelled (the demo's wall clock times its time scale, 20), in ms.
    sent = sends(recorded)
    first = min(sent.values())
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    if fmt == "mooncake":
        stamps = {(r["session_id"], n): r["timestamp"] for n, r in _numbered(lines)}
        assert stamps.keys() == sent.keys()
        for key, t in sent.items():
            assert abs(stamps[key] - (t - first) * 20 * 1000) <= 1, key
    # Replayed open loop (each turn at its time, as it was sent), against the same engine at the same scale.
    again = tmp_path / f"replayed.{fmt}.jsonl"
    rep = replay(out, again, "--trace-timing", "open")
    replayed = turns(rep)
    assert set(replayed) == set(original)
    for key, row in original.items():
        assert abs(replayed[key]["context_tokens"] - row["context_tokens"]) <= 0.02 * row["context_tokens"], key
    # The replay's turns are due as the run sent them (when it sent them is the client's: a loaded machine's late).
    before, after = gaps(sent), gaps(dues(again))
    assert set(before) == set(after) and before
    for key, gap in before.items():
        assert after[key] == pytest.approx(gap, rel=0.05), key
    if fmt == "mooncake":  # the prefixes the sessions shared are shared again, turn for turn
        for key, row in original.items():
            assert replayed[key]["ideal_cached_tokens"] == row["ideal_cached_tokens"], key
        assert replayed[("s2", 1)]["ideal_cached_tokens"] == 1024  # s1's two opening blocks
        assert rep["reuse"]["run"]["efficiency"] == 1.0
    else:  # AIPerf multi_turn has no hash ids: a session shares its own history, no other session's
        assert replayed[("s2", 1)]["ideal_cached_tokens"] == 0
        assert all(row["ideal_cached_tokens"] > 0 for (_, turn), row in replayed.items() if turn > 1)


def _numbered(rows: list[dict]) -> list[tuple[int, dict]]:
    """Mooncake rows with their turn within their session (the file's order)."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        seen[r["session_id"]] = seen.get(r["session_id"], 0) + 1
        out.append((seen[r["session_id"]], r))
    return out


def test_a_recording_reads_as_the_trace_it_replayed_and_says_when_that_is_gone(tmp_path, recorded, capsys):
    assert main(["trace", "info", str(recorded), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["block_size"], info["ideal_cached"]) == (512, 13_312)  # the trace's own: mooncake, 512
    # Modelled seconds (the wall clock's 0.7 s times 20): the trace's 12 s, and the replies a session waited for.
    assert 12 <= info["span_s"] < 30, info["span_s"]
    moved = tmp_path / "moved.jsonl"
    header, *rest = recorded.read_text().splitlines(keepends=True)
    head = json.loads(header)
    head["trace"]["path"] = str(tmp_path / "gone.jsonl")
    moved.write_text(json.dumps(head) + "\n" + "".join(rest))
    assert main(["trace", "export", str(moved), "--format", "mooncake", "-o", str(tmp_path / "m.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "gone.jsonl, which is not there: its turns' hash ids are derived" in err
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert rows[0]["hash_ids"][:2] != rows[1]["hash_ids"][:2]  # s1 and s2 no longer share their opening


def test_a_ramp_exports_as_its_sessions_and_turns(tmp_path, capsys):
    record = tmp_path / "ramp.jsonl"
    p = rw("demo", "--headless", "--profile", "fast", "--schedule", "2k,4k,8k", "--sessions", "2", "--gpus", "0",
           "--record", str(record))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    ran = turns(report_json(record))
    for fmt in ("mooncake", "aiperf"):
        out = tmp_path / f"ramp.{fmt}.jsonl"
        assert main(["trace", "export", str(record), "--format", fmt, "-o", str(out)]) == 0
        capsys.readouterr()
        assert main(["trace", "info", str(out), "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert (info["format"], info["sessions"], info["requests"]) == (fmt, 2, 6)
        assert info["turns_per_session"]["max"] == 3
        assert info["prompt_tokens"] == sum(row["context_tokens"] for row in ran.values())
        assert info["ideal_cached"] > 0  # each session's turns grow its own prefix
    rows = [json.loads(line) for line in (tmp_path / "ramp.mooncake.jsonl").read_text().splitlines()]
    by_session: dict[str, list[dict]] = {}
    for r in rows:
        by_session.setdefault(r["session_id"], []).append(r)
    assert set(by_session) == {"s1", "s2"}
    for s in by_session.values():
        assert [r["input_length"] for r in s] == sorted(r["input_length"] for r in s)
        assert s[1]["hash_ids"][:4] == s[0]["hash_ids"]  # turn 1's 2,048 tokens: four whole blocks, kept
    assert not set(by_session["s1"][0]["hash_ids"]) & set(by_session["s2"][0]["hash_ids"])  # salted apart


def test_reblocking_is_a_chained_hash_that_keeps_shared_prefixes_shared():
    r = Reblocker(16, 512)
    a = r.ids(range(0, 96), 1536)  # 96 source blocks: three whole 512-token blocks
    b = r.ids([*range(0, 64), *range(500, 532)], 1536)  # the same first 1,024 tokens, then its own
    c = r.ids(range(0, 70), 1100)  # the same first 1,024 tokens, then a partial block
    assert a == [1, 2, 3] and b[:2] == [1, 2] and b[2] != 3 and c[:2] == [1, 2] and c[2] not in (3, b[2])
    assert r.ids(range(0, 96), 1536) == a  # the same prompt, the same ids
    # Chained: a block after a different prefix is another block, even with the same tokens in it.
    assert r.ids([*range(900, 932), *range(32, 64)], 1024)[1] != 2
    # Any source block size, a divisor of the target's or not: two prompts that share their first `same` source
    # blocks share the 512-token blocks those cover whole, and no block after.
    for size in (64, 100, 512, 1024):
        r = Reblocker(size, 512)
        n, same = -(-2048 // size), 1024 // size
        x, y = r.ids(range(n), 2048), r.ids([*range(same), *range(1000, 1000 + n - same)], 2048)
        k = same * size // 512
        assert len(x) == len(y) == 4 and x[:k] == y[:k] and all(a != b for a, b in zip(x[k:], y[k:])), size


def test_aiperf_turns_are_each_turn_s_new_message_and_a_shrunk_context_starts_anew():
    def req(session: str, turn: int, due: float, n: int, closes: bool = False) -> TraceRequest:
        return TraceRequest(
            session=session, turn=turn, due_s=due, input_length=n, output_length=10, hash_ids=[], closes_session=closes
        )

    s = AiperfSessions()
    out = [line for r in (req("a", 1, 0, 100), req("b", 1, 0.5, 50, True)) for line in s.add(r)]
    assert out == []  # b is complete, but a started first and is still open
    out += s.add(req("a", 2, 2.0, 300))
    out += s.add(req("a", 3, 2.5, 200, True))  # smaller than a's 300 + 10 before it: a session of its own
    out += s.finish()
    assert [(line.session_id, [(t.input_length, t.timestamp, t.delay) for t in line.turns]) for line in out] == [
        ("a", [(100, 0, None), (190, None, 2000)]),
        ("b", [(50, 500, None)]),
        ("a~3", [(200, 2500, None)]),
    ]
    assert (s.started, s.split) == (3, 1)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["/no/such/trace.jsonl", "--format", "mooncake"], "no such trace: /no/such/trace.jsonl"),
        ([str(TRACES / "mooncake.jsonl"), "--format", "sharegpt"], "invalid choice: 'sharegpt'"),
        ([str(TRACES / "mooncake.jsonl")], "--format"),
        ([str(TRACES / "mooncake.jsonl"), "--format", "aiperf", "--from", "bailian"], "mooncake.jsonl"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    out = tmp_path / "out.jsonl"
    code = main(["trace", "export", *args, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing half-written


def test_an_existing_output_is_replaced_only_with_force(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text("mine\n")
    trace = str(TRACES / "aiperf.jsonl")
    assert main(["trace", "export", trace, "--format", "mooncake", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"rampwatch: {out} already exists (choose another --output, or --force to replace it)"
    assert out.read_text() == "mine\n"
    assert main(["trace", "export", trace, "--format", "mooncake", "-o", str(out), "--force"]) == 0
    assert json.loads(out.read_text().splitlines()[0])["session_id"] == "chat-a"
    assert main(["trace", "export", trace, "--format", "mooncake", "-o", str(tmp_path / "no" / "such.jsonl")]) == 2
    assert capsys.readouterr().err.strip().endswith("No such file or directory")
    assert main(["trace", "export", trace, "--format", "aiperf", "-o", str(tmp_path), "--force"]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_trace_info_draws_the_trace(tmp_path, capsys):
    svg, page = tmp_path / "trace.svg", tmp_path / "trace.html"
    trace = str(TRACES / "agentic.jsonl.gz")
    assert main(["trace", "info", trace, "--kv-tokens", "256k", "--svg", str(svg), "--html", str(page)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("trace ") and f"wrote {svg}" in err and f"wrote {page}" in err
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")
    text = " ".join("".join(e.itertext()) for e in root.iter())
    assert f"rampwatch: trace {trace}" in text and "KV pool 262,144" in text and "peak 363,096" in text
    assert len([e for e in root.iter() if e.get("class") == "rate"]) > 5
    assert "<pre>" in page.read_text() and "ideal hit" in page.read_text()
    code = main(["trace", "info", trace, "--svg", str(tmp_path / "no" / "such.svg")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot write" in err
