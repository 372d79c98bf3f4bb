"""Prompt shapes against a real vLLM CPU server (tiny random-weight Llama made by the fixture): the shared
lead found in its prefix cache, and a corpus of real code budgeted by its tokenizer. (A random model cannot
find a needle: tests/test_prompt_shapes.py checks that against the simulated engine.)"""

from __future__ import annotations

import pytest

from tests.test_prompt_shapes import (
    SOURCES,
    check_shared_lead_cached,
    check_targets,
    recorded_run,
    unique_system_prompt,
)
from tests.test_vllm_integration import kv_block_size

pytestmark = pytest.mark.vllm


def test_vllm_finds_the_shared_lead_cached_on_the_second_sessions_first_turn(vllm_server, tmp_path):
    rec = recorded_run(
        vllm_server,
        tmp_path / "lead.jsonl",
        "--sessions",
        "2",
        "--stagger",
        "5",
        "--system-prompt",
        unique_system_prompt(),
        "--shared-prefix",
        "1k",
    )
    check_shared_lead_cached(rec, kv_block_size(vllm_server))
    check_targets(rec)
    assert rec.header.prompts is not None and rec.header.prompts.shared_prefix_measured == 1024


def test_a_corpus_of_code_lands_every_turn_within_2_percent_on_vllm(vllm_server, tmp_path):
    rec = recorded_run(vllm_server, tmp_path / "corpus.jsonl", "--corpus", str(SOURCES), schedule="2k,4k,8k")
    check_targets(rec)
