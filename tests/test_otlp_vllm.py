"""--otlp against a real vLLM CPU server (issue 19; ENGINES.md §1.9): started with --enable-per-request-metrics and
--otlp-traces-endpoint pointing at `rampwatch run --otlp`, every span vLLM exports is joined to its turn and gives
the same queued, prefill and decode figures as the per-request metrics, within 1 ms."""

from __future__ import annotations

from pathlib import Path

import pytest

from rampwatch.drivers.run.recording import read_recording
from tests.conftest import free_port, run_against_real_server, vllm

pytestmark = pytest.mark.vllm

AGREE_S = 0.001


def test_every_vllm_span_is_matched_and_agrees_with_the_metrics(tiny_model, tmp_path_factory, tmp_path: Path):
    port = free_port()
    flags = ("--enable-per-request-metrics", "--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces")
    logs = tmp_path_factory.mktemp("vllm-otlp-log")
    with vllm(tiny_model, logs, *flags, env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}) as url:
        rec = tmp_path / "otlp.jsonl"
        args = ("--sessions", "2", "--lockstep", "--schedule", "2k,4k", "--output-tokens", "8", "--ignore-eos")
        rep = run_against_real_server(url, *args, "--otlp", str(port), record=rec)
    events = read_recording(rec).events
    sent = {e.request_id: (e.session, e.turn) for e in events if type(e).__name__ == "RequestSent"}
    spans = [e for e in events if type(e).__name__ == "EngineSpan"]
    assert len(sent) == 4 and sorted(s.request_id for s in spans) == sorted(sent), spans
    assert rep["spans"]["matched"] == 4 and rep["spans"]["unmatched"] == 0 and rep["spans"]["refused"] == 0
    done = {(e.session, e.turn): e for e in events if type(e).__name__ == "TurnDone"}
    for span in spans:
        d = done[sent[span.request_id]]
        assert abs(d.queued_s - span.queued_s) < AGREE_S, (d, span)
        assert abs(d.server_prefill_s - span.prefill_s) < AGREE_S, (d, span)
        assert abs(d.engine_decode_s - span.decode_s) < AGREE_S, (d, span)
    worst = rep["spans"]["max_disagreement_ms"]
    assert worst is not None and worst < AGREE_S * 1000
    print(f"vLLM's spans against its per-request metrics: worst difference {worst:.4f} ms over {len(spans)} turns")
