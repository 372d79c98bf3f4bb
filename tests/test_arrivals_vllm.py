"""Open-loop arrivals against a real vLLM CPU server (issue 22): `--arrivals 6/min --sessions 4 --scale-to 8k
--slo ttft=5s` completes, and every turn of the JSON report has a due time, a send time and an SLO verdict.
Seed 149 draws the four arrivals within 6 s (6/min averages 10 s apart), keeping the test short."""

from __future__ import annotations

import json

import pytest

from rampwatch.drivers.model.capacity import capacity_point
from rampwatch.drivers.run.arrivals import arrival_times
from rampwatch.tui.cli.files import load_state
from tests.conftest import report_json, rw, small_run

SEED = "149"


def test_open_loop_arrivals_against_vllm_record_due_send_and_verdict(vllm_server, tmp_path):
    record = tmp_path / "open.jsonl"
    args = ["--arrivals", "6/min", "--sessions", "4", "--scale-to", "8k", "--slo", "ttft=5s", "--seed", SEED]
    out = rw(*small_run(vllm_server, "--record", str(record), *args, schedule="seed"), timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = report_json(record)
    assert [s["id"] for s in rep["sessions"]] == ["s1", "s2", "s3", "s4"]
    turns = [t for s in rep["sessions"] for t in s["turns"]]
    assert len(turns) == 4 * 10  # the seed schedule scaled to 8k has ten turns
    for t in turns:
        assert t["due_s"] is not None and t["sent_s"] >= t["due_s"], t
        assert isinstance(t["slo_met"], bool) and isinstance(t["late"], bool)
        assert t["slo_met"] == (t["ttft_from_due_s"] <= 5.0)
    # Each conversation arrived at its seeded time after the drive's start (which waits for the probe: later on a
    # loaded machine), so the four came within 6 s of the drive.
    arrivals = [s["turns"][0]["due_s"] for s in rep["sessions"]]
    drawn = arrival_times(6 / 60, 4, int(SEED))
    begun = arrivals[0] - drawn[0]
    assert begun > 0 and arrivals == pytest.approx([begun + t for t in drawn], abs=1e-6) and drawn[-1] < 6.0
    g = rep["goodput"]
    assert g["turns"] == 40 and g["turns_met"] == sum(t["slo_met"] for t in turns)
    assert "goodput (SLO ttft=5s)" in out.stdout


def test_a_knee_search_against_vllm_runs_its_points_and_judges_each(vllm_server, tmp_path):
    """`sweep --find-max` over 6..24/min, three 20 s points: each recorded with the server's waiting queue
    read from vLLM's own gauge, each judged against the share, and the knee the sweep file names is the
    highest rate judged kept below every one judged missed."""
    path = tmp_path / "knee.sweep.json"
    flags = ["--find-max", "--arrivals", "6..24/min", "--max-points", "3", "--slo", "ttft=5s", "--seed", SEED]
    flags += ["--time-limit", "20s", "--grace", "5", "--schedule", "2k,4k", "--output-tokens", "8"]
    out = rw("sweep", vllm_server, *flags, "--gpu", "none", "--record", str(path), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    sweep = json.loads(path.read_text())
    assert len(sweep["runs"]) == 3 and sweep["slo"] == "ttft=5s" and sweep["slo_share"] == 0.95
    kept, missed = [], []
    for name, rate in zip(sweep["runs"], sweep["arrivals_per_min"], strict=True):
        state = load_state(tmp_path / name, skip_bad_lines=False)
        point = capacity_point(state)
        assert point is not None and point.offered_per_min == pytest.approx(rate)
        assert point.waiting_peak is not None and point.turns > 0
        (kept if point.status != "saturated" and (point.goodput_share or 0) >= 0.95 else missed).append(rate)
    assert sweep["knee_per_min"] == (max(r for r in kept if not missed or r < min(missed)) if kept else None)
    assert sweep["knee_fail_per_min"] == (min(missed) if missed else None)
    assert "sweep: one point per arrival rate (open loop)" in out.stdout and "knee:" in out.stdout
