"""`rampwatch compare` and `rampwatch sweep`, as a user runs them."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
from tests.conftest import rampwatch_cmd
from tests.conftest import rw as rw_in_root
from tests.simhost import ThreadedSim

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [ROOT / "recordings" / "glm-like-2x1m.sample.jsonl", ROOT / "recordings" / "vllm-cpu-2x32k.sample.jsonl"]


rw = functools.partial(rw_in_root, timeout=300)  # a demo or a sweep runs longer than most commands


@pytest.fixture(scope="module")
def demo_recording(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "demo.jsonl"
    p = rw("demo", "--headless", "--scale-to", "128k", "--time-scale", "200", "--record", str(out))
    assert p.returncode == 0, p.stderr
    return out


def test_compare_prints_all_formats_and_matches_each_runs_report(demo_recording):
    runs = [*map(str, SHIPPED), str(demo_recording)]
    out = {
        fmt: rw("compare", *runs, "--format", fmt, "--label", "glm", "--label", "vllm", "--label", "demo")
        for fmt in ("table", "md", "csv", "json")
    }
    assert all(p.returncode == 0 for p in out.values()), {k: p.stderr for k, p in out.items()}
    assert "TTFT per turn" in out["table"].stdout and "| run |" in out["md"].stdout
    assert (
        out["csv"].stdout.splitlines()[0].startswith("label,path,engine") and len(out["csv"].stdout.splitlines()) == 4
    )
    cmp = json.loads(out["json"].stdout)
    assert (
        cmp["schema"] == 7 and cmp["baseline"] == "glm" and [r["label"] for r in cmp["runs"]] == ["glm", "vllm", "demo"]
    )
    assert "schedules differ" in " ".join(cmp["notes"])
    for row, path in zip(cmp["runs"], runs):
        rep = json.loads(rw("report", path, "--format", "json").stdout)
        worst = max(rep["sessions"], key=lambda s: s["summary"]["ttft_sum_s"])
        assert row["slowest_session_ttft_sum_s"] == worst["summary"]["ttft_sum_s"]
        assert row["session_ttft_sums_s"] == [s["summary"]["ttft_sum_s"] for s in rep["sessions"]]
        assert row["ttft_max_s"] == max(s["summary"]["ttft_max_s"] for s in rep["sessions"])
        assert (
            row["kv_peak"] == rep["server"]["kv_peak"]
            and row["hit_rate_last_turn"] == rep["server"]["hit_rate_last_turn"]
        )
        assert row["lockstep"] == rep["run"]["lockstep"] and row["sessions"] == rep["run"]["sessions"]
        # Turn k: the slowest session's TTFT, and the engine's queued and prefill time of that same turn.
        k = runs.index(path)
        for col in cmp["turns"]:
            mine = [t for s in rep["sessions"] for t in s["turns"] if t["turn"] == col["turn"] and not t["error"]]
            if not mine:
                assert col["ttft_s"][k] is None
                continue
            slowest = max(mine, key=lambda t: t["ttft_s"])
            assert col["ttft_s"][k] == slowest["ttft_s"]
            engine = (slowest["queued_s"], slowest["engine_prefill_s"])
            assert (col["queued_s"][k], col["engine_prefill_s"][k]) == engine
    glm_split = [c["engine_prefill_s"][0] for c in cmp["turns"]]
    assert all(x is not None for x in glm_split) and all(c["engine_prefill_s"][1] is None for c in cmp["turns"])
    assert "glm queued + prefill + front end s" in out["md"].stdout and "vllm queued + prefill" not in out["md"].stdout
    assert set(cmp) == {"schema", "baseline", "runs", "turns", "notes"}
    assert set(cmp["runs"][0]) == {
        "label",
        "path",
        "engine",
        "engine_version",
        "model",
        "sessions",
        "lockstep",
        "turns_completed",
        "turns_planned",
        "context_reached",
        "slowest_session_ttft_sum_s",
        "session_ttft_sums_s",
        "ttft_max_s",
        "last_turn_ttft_s",
        "one_shot_ttft_s",
        "prefill_tok_s_first_turn",
        "prefill_tok_s_last_turn",
        "decode_tok_s_median",
        "hit_rate_last_turn",
        "kv_peak",
        "needle_found",
        "needle_asked",
        "needle_no_answer",
        "ttfa_max_s",
        "reasoning_tokens",
        "worst_gap_during_foreign_prefill_s",
        "failed_turns",
        "slowest_session_queued_sum_s",
        "slowest_session_engine_prefill_sum_s",
        "slowest_session_front_end_sum_s",
        "slo",
        "slo_turns_met",
        "slo_turns_met_per_min",
        "late_turns",
        "slo_conversations_met",
        "slo_conversations_met_per_min",
        "cache_efficiency",
        "affinity",
        "moved_sessions",
    }
    first = cmp["turns"][0]
    assert first["ratio_to_baseline"][0] == 1.0 and len(first["ttft_s"]) == 3
    assert set(first) == {
        "turn",
        "ttft_s",
        "ratio_to_baseline",
        "queued_s",
        "engine_prefill_s",
        "front_end_s",
        "ttfa_s",
        "served_by",
    }


THREE = [*map(str, SHIPPED), str(ROOT / "recordings" / "llamacpp-cpu-2x15k.sample.jsonl")]


@pytest.mark.parametrize("columns", [80, 120])
def test_compare_fits_a_terminal_and_says_what_it_left_out(columns):
    """In a real terminal (a pty of that width) no line is wider than the terminal, no run's label wraps onto a
    second line, and what was left out to fit is said."""
    cmd = " ".join([*rampwatch_cmd(), "compare", *THREE])
    p = procs.run(
        ["script", "-qc", cmd, "/dev/null"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "COLUMNS": str(columns), "LINES": "50"},
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.replace("\r", "").splitlines()
    assert max(len(line) for line in lines) <= columns
    body = [line for line in lines if line.startswith("│")]
    runs_rows = body[:3]
    assert [row.split("│")[1].strip()[:4] for row in runs_rows] == ["sim-", "tiny", "tiny"]  # one line a run
    assert "slowest" in p.stdout and "left out to fit" in p.stdout


def test_compare_piped_keeps_every_column_on_one_line_a_run():
    p = rw("compare", *THREE)
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 3 + 10  # three runs, ten turns: nothing wrapped
    heads = p.stdout.split("┡")[0]
    for head in ("slowest", "one-shot", "worst", "engine", "KV", "peak"):
        assert head in heads
    assert "left out" not in p.stdout


def test_compare_baseline_and_bad_input(tmp_path):
    p = rw("compare", *map(str, SHIPPED), "--baseline", SHIPPED[1].name, "--format", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["baseline"].startswith("tiny@vllm")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("id,ttft\n1,2\n")
    p = rw("compare", str(SHIPPED[0]), str(bad))
    assert p.returncode == 2 and "not a rampwatch recording" in p.stderr and p.stderr.count("\n") == 1
    p = rw("compare", *map(str, SHIPPED), "--label", "only-one")
    assert p.returncode == 2 and "--label" in p.stderr
    p = rw("compare", *map(str, SHIPPED), "--baseline", "nope")
    assert p.returncode == 2 and "not one of the runs" in p.stderr


def sweep_args(url: str, record: Path, *extra: str, output_tokens: int) -> list[str]:
    """A sweep over 1, 2 and 4 sessions of three short turns, without GPUs."""
    sized = ["--sessions", "1,2,4", "--schedule", "4k,8k,16k", "--output-tokens", str(output_tokens), "--ignore-eos"]
    return ["sweep", url, *sized, "--gpu", "none", *extra, "--record", str(record)]


def test_sweep_writes_a_recording_per_point_and_a_curve(tmp_path):
    sweep = tmp_path / "s.sweep.json"
    with ThreadedSim(make_profile("tiny", time_scale=0.5)) as s:
        p = rw(*sweep_args(s.url, sweep, output_tokens=16))
    assert p.returncode == 0, p.stderr
    listed = json.loads(sweep.read_text())
    assert listed["sessions"] == [1, 2, 4] and listed["runs"] == ["s-1s.jsonl", "s-2s.jsonl", "s-4s.jsonl"]
    assert all((tmp_path / r).exists() for r in listed["runs"]) and listed["stopped"] is None
    assert "sweep: one point per session count" in p.stdout
    cmp = json.loads(rw("compare", str(sweep), "--format", "json").stdout)
    assert [r["sessions"] for r in cmp["runs"]] == [1, 2, 4] and all(r["lockstep"] for r in cmp["runs"])
    slowest = [r["last_turn_ttft_s"] for r in cmp["runs"]]
    assert slowest[0] < slowest[1] < slowest[2], slowest


def test_sweep_refuses_bad_counts():
    p = rw("sweep", "http://127.0.0.1:9", "--sessions", "4,2")
    assert p.returncode == 2 and "growing" in p.stderr and p.stderr.count("\n") == 1


def test_sweep_stops_when_the_server_starts_to_preempt(tmp_path):
    sweep = tmp_path / "p.sweep.json"
    # Two 16K sessions do not fit, and the second gets in beside the first: its 8K prefix, still cached (a prefix is
    # evicted tail first), and its first chunk fit in what the first leaves free. In a tighter pool it would wait.
    with ThreadedSim(make_profile("tiny", kv_tokens=27_000)) as s:
        p = rw(*sweep_args(s.url, sweep, "--scrape-interval", "0.1", output_tokens=64))
    assert p.returncode == 0, p.stderr
    listed = json.loads(sweep.read_text())
    assert listed["runs"] == ["p-1s.jsonl", "p-2s.jsonl"] and "preempted" in listed["stopped"]
    assert "stopped: the server preempted" in p.stdout
