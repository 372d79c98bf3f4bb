"""The engine's own account of every turn against a real vLLM CPU server started with --enable-per-request-metrics
(issue 19; ENGINES.md §1.9): every turn of a two-session lockstep ramp has vLLM's queue and prefill times, they
never exceed the client's TTFT, and what is left (HTTP, template, tokenizer, network) is small."""

from __future__ import annotations

from pathlib import Path

import pytest

from rampwatch.drivers.model.turns import CLOCK_TOLERANCE_S
from rampwatch.drivers.run.recording import read_recording
from tests.conftest import run_against_real_server, vllm

pytestmark = pytest.mark.vllm

REST_MAX_S = 2.0  # the client's and the API server's part of a TTFT on these 2 shared cores under load (measured: docs)
REST_MEDIAN_MAX_S = 0.5


@pytest.fixture  # one test each: its server stops when the test ends (24 GiB hold only so many)
def vllm_timed(tiny_model, tmp_path_factory):
    """A real vLLM CPU server that times each request itself (its own server: the shared one's responses stay as
    they were for every other test)."""
    with vllm(tiny_model, tmp_path_factory.mktemp("vllm-timed-log"), "--enable-per-request-metrics") as url:
        yield url


def test_every_turn_has_vllms_queue_and_prefill_time(vllm_timed, tmp_path: Path):
    rec = tmp_path / "timed.jsonl"
    rep = run_against_real_server(
        vllm_timed,
        "--sessions",
        "2",
        "--lockstep",
        "--scale-to",
        "8k",
        "--output-tokens",
        "8",
        "--ignore-eos",
        record=rec,
    )
    rows = [t for s in rep["sessions"] for t in s["turns"]]
    assert len(rows) == 20 and all(t["error"] is None for t in rows)
    for t in rows:
        assert t["queued_s"] is not None and t["engine_prefill_s"] is not None, t
        assert t["queued_s"] + t["engine_prefill_s"] <= t["ttft_s"] + CLOCK_TOLERANCE_S, t
        assert t["ttft_rest_s"] == pytest.approx(t["ttft_s"] - t["queued_s"] - t["engine_prefill_s"])
        assert 0 <= t["ttft_rest_s"] + CLOCK_TOLERANCE_S and t["ttft_rest_s"] < REST_MAX_S, t
    for s in rep["sessions"]:
        assert s["summary"]["engine_prefill_sum_s"] == pytest.approx(sum(t["engine_prefill_s"] for t in s["turns"]))
    assert rep["interference"]["extra_wait_queued_s"] is not None
    # vLLM knew each request by the id rampwatch sent: one per attempt, recorded with it.
    sent = [e for e in read_recording(rec).events if type(e).__name__ == "RequestSent"]
    assert len({e.request_id for e in sent}) == len(sent) == 20
    rests = sorted(t["ttft_rest_s"] for t in rows)
    assert rests[len(rests) // 2] < REST_MEDIAN_MAX_S, rests
    print(f"rest of the TTFT: median {rests[len(rests) // 2] * 1000:.0f} ms, max {rests[-1] * 1000:.0f} ms")


NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'


@pytest.fixture  # one test: its server stops when the test ends
def vllm_speculating(tiny_model, tmp_path_factory):
    """A real vLLM CPU server with n-gram speculative decoding, reporting each request's acceptance (ENGINES.md
    §1.10: the random model at temperature 0 repeats itself, so a later turn's prompt holds what it generates)."""
    spec = ("--speculative-config", NGRAM, "--per-request-spec-decode-metrics", "summary")
    with vllm(tiny_model, tmp_path_factory.mktemp("vllm-spec-log"), "--enable-per-request-metrics", *spec) as url:
        yield url


def test_speculative_acceptance_per_turn_and_live(vllm_speculating, tmp_path: Path):
    rec = tmp_path / "spec.jsonl"
    rep = run_against_real_server(
        vllm_speculating, "--schedule", "2k,4k,6k", "--output-tokens", "32", "--ignore-eos", record=rec
    )
    rows = rep["sessions"][0]["turns"]
    drafted = [t for t in rows if t["spec_drafted"]]
    assert drafted, rows  # turn 2 on re-sends turn 1's repeated token: the proposer finds it
    assert all(0 <= t["spec_accepted"] <= t["spec_drafted"] for t in drafted)
    samples = [e for e in read_recording(rec).events if type(e).__name__ == "MetricsSample"]
    assert max(s.values.get("spec_drafted", 0.0) for s in samples) >= sum(t["spec_drafted"] for t in drafted)
    print("spec per turn:", [(t["spec_accepted"], t["spec_drafted"]) for t in rows])
