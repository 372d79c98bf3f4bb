"""--trace (issue 35): a trace in each format replayed against the simulated engine as a user runs it: its
sessions and turns as the trace says, every prompt within 2% of its input_length (16 tokens for short ones), and
the server's prefix cache supplying exactly what the trace's shared blocks allowed (cache efficiency 1.00) where
the trace names its blocks; bad input is one line and exit 2, before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from rampwatch.drivers.model.trace import collect_sessions
from rampwatch.drivers.run.trace_read import open_trace
from tests.conftest import report_json, rw

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
