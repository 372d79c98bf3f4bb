"""Open-loop arrivals against a real vLLM CPU server (issue 22): `--arrivals 6/min --sessions 4 --scale-to 8k
--slo ttft=5s` completes, and every turn of the JSON report has a due time, a send time and an SLO verdict.
Seed 149 draws the four arrivals within 6 s (6/min averages 10 s apart), keeping the test short."""

from __future__ import annotations

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
    arrivals = [s["turns"][0]["due_s"] for s in rep["sessions"]]
    assert arrivals == sorted(arrivals) and arrivals[-1] < 6.0
    g = rep["goodput"]
    assert g["turns"] == 40 and g["turns_met"] == sum(t["slo_met"] for t in turns)
    assert "goodput (SLO ttft=5s)" in out.stdout
