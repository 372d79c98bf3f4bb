"""Reasoning against a real vLLM CPU server: its deepseek_r1 reasoning parser over the tiny random model made a
"reasoning model" (tests/make_tiny_model.py --think: <think> and </think> in the vocabulary, a chat template that
opens a think block, which enable_thinking=false closes), so everything it generates streams as `reasoning` until
it samples </think>, or until vLLM's thinking_token_budget, when a request sets one, forces it."""

from __future__ import annotations

import json

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import read_recording
from tests import procs
from tests.conftest import HERE, VLLM_VENV, _vllm_python, missing, run_against_real_server, vllm

pytestmark = pytest.mark.vllm

SCHEDULE = "2k,4k,6k"
TARGETS = [2048, 4096, 6144]
# vLLM's thinking_token_budget: once the think block holds BUDGET tokens (the template's newline after <think>
# counts) it forces </think>, and the rest of ANSWERED_OF is the answer. The answer comes ~450 decode steps (0.9-1.2
# s here) after the first token: the client would have to stall that long to read both at once. With 48 (~0.1 s) a
# run under load had the client late by 170 ms on every turn, reading each whole reply at once (TTFA = TTFT, rightly,
# for what it saw).
BUDGET, ANSWERED_OF = 448, 512


@pytest.fixture(scope="module")
def vllm_reasoning(tmp_path_factory):
    """A real vLLM CPU server with --reasoning-parser deepseek_r1, serving the tiny model made to think."""
    py = _vllm_python()
    if py is None:
        missing("VLLM", f"no vLLM virtualenv at {VLLM_VENV}: run .ci/setup_vllm.sh")
    model = tmp_path_factory.mktemp("tiny-think")
    procs.run(
        [str(py), str(HERE / "make_tiny_model.py"), str(model), "--think"], check=True, capture_output=True, timeout=300
    )
    with vllm((py, model), tmp_path_factory.mktemp("vllm-think-log"), "--reasoning-parser", "deepseek_r1") as url:
        yield url


def reasoned_run(url: str, record, *extra: str, output_tokens: int = 64) -> tuple[dict, list[ev.TurnDone]]:
    rep = run_against_real_server(
        url, "--schedule", SCHEDULE, "--output-tokens", str(output_tokens), "--ignore-eos", *extra, record=record
    )
    done = [e for e in read_recording(record).events if isinstance(e, ev.TurnDone) and e.status == "ok"]
    return rep, done


def test_reasoning_counts_come_from_the_stream_where_vllms_usage_undercounts(vllm_reasoning, tmp_path):
    rep, done = reasoned_run(vllm_reasoning, tmp_path / "think.jsonl")
    [session] = rep["sessions"]
    assert len(done) == len(session["turns"]) == len(TARGETS)
    for e, t in zip(done, session["turns"]):
        # vLLM 0.32 counts reasoning tokens between a generated <think> and </think> only: the template opened the
        # block in the prompt, so usage says 0 while every chunk until a sampled </think> (if any) was reasoning.
        assert e.reasoning_tokens == 0 and e.reasoning_chunks > 0
        assert t["reasoning_tokens"] >= e.reasoning_chunks and t["reasoning_tokens"] + t["answer_tokens"] == 64
        if t["no_answer"]:  # all 64 tokens thought (the usual case): cut before any answer
            assert t["reasoning_tokens"] == 64 and t["needle"] is None and t["ttfa_s"] is None
        else:  # the random model sampled </think>: what followed is the answer, and came later
            assert t["ttfa_s"] > t["ttft_s"]
        assert t["ttft_s"] > 0
    contexts = [t["context_tokens"] for t in session["turns"]]
    assert all(abs(c - target) <= 0.02 * target for c, target in zip(contexts, TARGETS)), contexts


def test_reasoning_off_reaches_the_chat_template(vllm_reasoning, tmp_path):
    """--reasoning off: enable_thinking=false closes the think block in the prompt, and the parser streams content."""
    rep, done = reasoned_run(vllm_reasoning, tmp_path / "off.jsonl", "--reasoning", "off")
    [session] = rep["sessions"]
    for e, t in zip(done, session["turns"]):
        assert e.reasoning_chunks == 0 and t["reasoning_tokens"] == 0 and t["answer_tokens"] == 64
        assert not t["no_answer"] and t["needle"] is not None and t["ttfa_s"] == t["ttft_s"]
    contexts = [t["context_tokens"] for t in session["turns"]]
    assert all(abs(c - target) <= 0.02 * target for c, target in zip(contexts, TARGETS)), contexts


def test_an_answer_after_the_thinking_budget_comes_after_the_first_token(vllm_reasoning, tmp_path):
    """Every turn thinks, then answers, whatever the random model samples: vLLM's thinking_token_budget (sent with
    --extra-body) forces </think> once the block holds BUDGET tokens, and the rest of ANSWERED_OF is the answer. So
    the time to the first answer token is measured on every turn, and it is later than the first (reasoning)
    token's."""
    body = json.dumps({"thinking_token_budget": BUDGET})
    rep, done = reasoned_run(vllm_reasoning, tmp_path / "budget.jsonl", "--extra-body", body, output_tokens=ANSWERED_OF)
    [session] = rep["sessions"]
    assert len(done) == len(session["turns"]) == len(TARGETS)
    for e, t in zip(done, session["turns"]):
        # Without the server's count, the reasoning tokens are its chunks scaled by the reply's tokens a chunk: a
        # chunk that carried two tokens (CI saw 512 tokens in 510 chunks) may add to them wherever it was.
        spread = e.completion_tokens - e.chunks
        assert e.reasoning_chunks > 0 and 0 < t["reasoning_tokens"] <= BUDGET + spread, t
        assert not t["no_answer"] and t["answer_tokens"] > 0, t
        assert t["reasoning_tokens"] + t["answer_tokens"] == ANSWERED_OF, t
        assert t["ttfa_s"] > t["ttft_s"] > 0, t  # fails if the first answer token's time were the first token's
    gaps = [(t["reasoning_tokens"], round(t["ttfa_s"] - t["ttft_s"], 3)) for t in session["turns"]]
    print("each turn's reasoning tokens, and how much later its answer came (s):", gaps)
