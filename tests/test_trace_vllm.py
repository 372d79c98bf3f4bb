"""--trace against a real vLLM CPU server (issue 35): the Mooncake test trace, whose sessions open with the same
two 512-token blocks, replayed with prefix caching on: every later session's turn 1 finds those 1,024 tokens
cached (vLLM's 16-token blocks divide the trace's 512, so the figure is exact), every prompt is its
input_length, and the run's cache efficiency is 1.00; with prefix caching off it is 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_against_real_server, vllm

pytestmark = pytest.mark.vllm

TRACE = Path(__file__).resolve().parent / "data" / "traces" / "mooncake.jsonl"
SHARED = 1024  # the two leading blocks every session of the trace opens with


def replay(url: str, record: Path) -> dict:
    return run_against_real_server(url, "--trace", str(TRACE), "--ignore-eos", record=record)


def test_a_mooncake_trace_reuses_what_its_shared_blocks_allow(vllm_server, tmp_path: Path):
    rep = replay(vllm_server, tmp_path / "trace.jsonl")
    turns = {(s["id"], t["turn"]): t for s in rep["sessions"] for t in s["turns"]}
    assert len(turns) == 10 and all(t["error"] is None for t in turns.values())
    firsts = [t for (sid, turn), t in turns.items() if turn == 1 and sid != "s1"]
    assert len(firsts) == 4 and all(t["cached_tokens"] == SHARED == t["ideal_cached_tokens"] for t in firsts), firsts
    assert turns[("s1", 1)]["context_tokens"] == 1700 and turns[("s1", 3)]["context_tokens"] == 3900
    assert rep["reuse"]["run"]["efficiency"] >= 0.9, rep["reuse"]
    print(f"vLLM's cache efficiency on the trace: {rep['reuse']['run']['efficiency']:.3f}")


def test_without_prefix_caching_the_efficiency_is_near_zero(tiny_model, tmp_path_factory, tmp_path: Path):
    with vllm(tiny_model, tmp_path_factory.mktemp("vllm-nocache-log"), "--no-enable-prefix-caching") as url:
        rep = replay(url, tmp_path / "nocache.jsonl")
    assert rep["reuse"]["run"]["ideal_tokens"] > 0
    assert rep["reuse"]["run"]["efficiency"] <= 0.05, rep["reuse"]
