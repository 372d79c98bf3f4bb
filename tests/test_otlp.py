"""--otlp: the OTLP/HTTP receiver of the engine's trace spans, and their join to turns.

A real OpenTelemetry SDK exporter sends to the receiver; bad requests are refused and counted while it keeps
serving; and a run against the simulated engine, exporting spans from its own scheduler, joins every span to
its turn with the same figures as the per-request metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgspec
import pytest

from rampwatch.drivers.client.request_ids import span_id, trace_id, traceparent
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.sim.engine import SimEngine
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.drivers.sim.traces import request_span
from rampwatch.drivers.telemetry.otlp import MAX_BODY_BYTES, OtlpReceiver
from rampwatch.tui.cli.files import load_state
from tests.conftest import free_port, report_json, rw, small_run
from tests.simhost import ThreadedSim


async def _receiver() -> tuple[OtlpReceiver, list[ev.AnyEvent]]:
    seen: list[ev.AnyEvent] = []
    r = OtlpReceiver(seen.append, lambda: 1.0)
    await r.start("127.0.0.1", 0)
    return r, seen


def _export_with_sdk(port: int) -> None:
    """Two spans through the OpenTelemetry SDK's own OTLP/HTTP protobuf exporter: vLLM's per-request span, and a
    startup span the receiver ignores."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("Load weights"):
        pass
    attrs = {
        "gen_ai.latency.time_in_queue": 0.25,
        "gen_ai.latency.time_in_model_prefill": 1.5,
        "gen_ai.latency.time_in_model_decode": 0.75,
        "gen_ai.latency.e2e": 2.5,
        "gen_ai.request.id": "chatcmpl-abc-s1-t2-a1",
    }
    with tracer.start_as_current_span("llm_request", attributes=attrs):
        pass
    provider.shutdown()


async def test_a_real_sdk_exporters_spans_are_decoded_and_counted():
    r, seen = await _receiver()
    try:
        await asyncio.to_thread(_export_with_sdk, r.port)
    finally:
        await r.aclose()
    spans = [e for e in seen if isinstance(e, ev.EngineSpan)]
    assert len(spans) == 1, seen  # the startup span is not a request
    s = spans[0]
    assert (s.request_id, s.queued_s, s.prefill_s, s.decode_s, s.e2e_s) == ("abc-s1-t2-a1", 0.25, 1.5, 0.75, 2.5)
    assert len(s.trace_id) == 32
    assert r.spans == 1 and r.received == {"abc-s1-t2-a1"} and r.errors == 0


async def test_bad_requests_are_refused_counted_and_the_receiver_keeps_serving():
    r, seen = await _receiver()
    url = f"http://127.0.0.1:{r.port}"
    try:
        async with httpx.AsyncClient(trust_env=False) as c:
            bad = await c.post(url + "/v1/traces", content=b"\xff\xfe not protobuf at all")
            big = await c.post(url + "/v1/traces", content=b"\0" * (MAX_BODY_BYTES + 1))
            assert (await c.get(url + "/v1/traces")).status_code == 405
            assert (await c.post(url + "/v1/metrics", content=b"")).status_code == 404
            ok = await c.post(url + "/v1/traces", content=b"")  # an empty export is a valid one
        # What no HTTP client library sends: a chunk size that is not hex, and 70 KB of headers.
        chunk = await _raw(r.port, b"POST /v1/traces HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        heads = await _raw(r.port, b"POST /v1/traces HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        await asyncio.to_thread(_export_with_sdk, r.port)
    finally:
        await r.aclose()
    assert bad.status_code == 400 and big.status_code == 400 and ok.status_code == 200
    assert chunk.startswith(b"HTTP/1.1 400") and heads.startswith(b"HTTP/1.1 400")
    errors = [e for e in seen if isinstance(e, ev.TraceReceiverError)]
    assert r.errors == 4 and len(errors) == 4
    assert "OTLP" in errors[0].error and "MiB" in errors[1].error
    assert "chunk size" in errors[2].error and "headers" in errors[3].error
    assert [e.request_id for e in seen if isinstance(e, ev.EngineSpan)] == ["abc-s1-t2-a1"]


async def _raw(port: int, request: bytes) -> bytes:
    """`request` as bytes on a socket of its own; the answer's first line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return line


async def test_the_runs_end_waits_for_due_spans_and_notices_what_matched_nothing():
    """The SDK's span (id abc-s1-t2-a1) belongs to no request of this run; the run's one turn never gets its span:
    one Notice at the end says both, after a bounded wait."""
    r, seen = await _receiver()
    r.FINAL_WAIT_S = 0.3
    r.follow(ev.RequestSent(t=0, session="s1", turn=1, target_tokens=1, new_tokens_est=1, body_bytes=1, request_id="x"))
    r.follow(ev.TurnDone(t=1, session="s1", turn=1, status="ok", completion_tokens=1))
    await asyncio.to_thread(_export_with_sdk, r.port)
    await r.finish(wait=True)
    notices = [e for e in seen if isinstance(e, ev.Notice)]
    assert r.unmatched == 1 and len(notices) == 1, seen
    assert "1 span matched no turn" in notices[0].message and "1 turn got no span" in notices[0].message
    assert notices[0].level == "warn"


def _recorded(path: Path) -> list[ev.AnyEvent]:
    dec = msgspec.json.Decoder(ev.AnyEvent)
    return [dec.decode(line) for line in path.read_bytes().splitlines()[1:]]


@pytest.mark.parametrize("metrics", [True, False], ids=["with-metrics", "spans-only"])
def test_a_run_joins_every_simulated_span_to_its_turn(tmp_path, metrics):
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    record = tmp_path / "run.jsonl"
    with ThreadedSim(make_profile("tiny"), per_request_metrics=metrics, otlp_traces_endpoint=endpoint) as sim:
        p = rw(*small_run(sim.url, "--sessions", "2", "--lockstep", "--otlp", str(port), "--record", str(record)))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"receiving OTLP spans on http://127.0.0.1:{port}/v1/traces" in p.stderr  # loopback by default
    assert "Traceback" not in p.stderr and "Exception in callback" not in p.stderr  # kept-alive connections end cleanly
    events = _recorded(record)
    sent = {e.request_id for e in events if isinstance(e, ev.RequestSent)}
    spans = [e for e in events if isinstance(e, ev.EngineSpan)]
    assert len(sent) == 4 and {s.request_id for s in spans} == sent  # every turn's span, each matched
    # Each in rampwatch's own trace for that turn (the traceparent it sent). The recorded span keeps no parent
    # id, so that it hangs from the attempt's span is test_the_sims_span_is_a_child_of_the_span_rampwatch_sent's.
    for span in spans:
        run, session, turn, _attempt = span.request_id.rsplit("-", 3)
        assert span.trace_id == trace_id(run, session, int(turn[1:])), span
    assert not [e for e in events if isinstance(e, ev.Notice) and e.message.startswith("OTLP")]  # nothing unexplained
    rep = report_json(record)
    assert rep["spans"]["matched"] == 4 and rep["spans"]["unmatched"] == 0 and rep["spans"]["refused"] == 0
    turns = [t for s in rep["sessions"] for t in s["turns"]]
    by_id = {s.request_id: s for s in spans}
    done = {(e.session, e.turn): e for e in events if isinstance(e, ev.TurnDone)}
    sent_by_turn = {(e.session, e.turn): e.request_id for e in events if isinstance(e, ev.RequestSent)}
    for key, d in done.items():
        span = by_id[sent_by_turn[key]]
        if metrics:  # the response's metrics and the span agree within 1 ms
            assert abs(d.queued_s - span.queued_s) < 0.001 and abs(d.engine_prefill_s - span.prefill_s) < 0.001
            assert abs(d.engine_decode_s - span.decode_s) < 0.001
        else:
            assert d.engine_prefill_s is None
    assert all(t["engine_timing"] == ("metrics" if metrics else "span") for t in turns), turns
    assert all(t["queued_s"] is not None and t["engine_prefill_s"] is not None for t in turns)
    if metrics:
        assert rep["spans"]["max_disagreement_ms"] < 1.0
    else:
        assert all(t["ttft_rest_s"] > -0.005 for t in turns)
    text = rw("report", str(record)).stdout
    assert "engine spans (OTLP): 4 matched, 0 unmatched" in text, text
    # The decode lanes draw each timed wait's parts, whether the figures came with the turn or in a later span.
    state = load_state(record, skip_bad_lines=False)
    assert all(sum(p == "prefill" for p, _, _ in state.sessions[sid].waits) == 2 for sid in ("s1", "s2"))


def test_spans_of_no_turn_are_counted_not_dropped():
    from rampwatch.drivers.model.analysis import build_report
    from rampwatch.drivers.model.state import RunState

    st = RunState()
    st.apply(
        ev.RequestSent(
            t=0.0, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1, request_id="run-s1-t1-a1"
        )
    )
    st.apply(ev.EngineSpan(t=0.5, request_id="someone-else", prefill_s=0.1))
    st.apply(ev.FirstToken(t=0.9, session="s1", turn=1))
    st.apply(ev.TurnDone(t=1.0, session="s1", turn=1, status="ok", completion_tokens=1))
    st.apply(ev.EngineSpan(t=2.0, request_id="run-s1-t1-a1", queued_s=0.2, prefill_s=0.5, decode_s=0.1))
    assert (st.spans.matched, st.spans.unmatched) == (1, 1)
    rec = st.turns[0]
    assert (rec.queued_s, rec.engine_prefill_s, rec.engine_decode_s, rec.engine_timing) == (0.2, 0.5, 0.1, "span")
    rep = build_report(st)
    assert rep.spans is not None and (rep.spans.matched, rep.spans.unmatched) == (1, 1)
    assert any("matches no turn" in x.text for x in st.log)


def test_otlp_port_is_checked_before_the_run():
    p = rw("run", "http://127.0.0.1:9", "--otlp", "nope", "--headless", "--no-record")
    assert p.returncode == 2 and "--otlp" in p.stderr and "Traceback" not in p.stderr


def test_the_demo_checks_its_engines_metrics_against_its_spans(tmp_path):
    """The demo turns both of the engine's accounts on, as vLLM gives them: every turn's span is matched and
    agrees with that turn's per-request metrics."""
    record = tmp_path / "demo.jsonl"
    p = rw("demo", "--headless", "--schedule", "8k,16k", "--time-scale", "5", "--record", str(record))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = report_json(record)
    turns = [t for s in rep["sessions"] for t in s["turns"]]
    assert len(turns) == 4 and all(t["engine_timing"] == "metrics" for t in turns)
    assert rep["spans"]["matched"] == 4 and rep["spans"]["unmatched"] == 0
    assert rep["spans"]["max_disagreement_ms"] < 1.0


def test_a_retried_span_counts_once_and_is_no_unmatched_span():
    """An exporter may send a span again (a retry after a lost answer): the turn keeps its first, the count
    stays one, and no "matches no turn" line appears."""
    from rampwatch.drivers.model.state import RunState

    state = RunState(ev.Header(rampwatch_version="t", command=[], mode="run", server="x"))
    state.apply(ev.SessionPlanned(t=0, session="s1", schedule=[100], salt="a"))
    state.apply(
        ev.RequestSent(
            t=0.1, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1, request_id="r1"
        )
    )
    state.apply(ev.FirstToken(t=0.5, session="s1", turn=1))
    state.apply(ev.TurnDone(t=0.9, session="s1", turn=1, status="ok", completion_tokens=2, chunks=2))
    span = ev.EngineSpan(t=1.0, request_id="r1", queued_s=0.1, prefill_s=0.25, decode_s=0.4)
    state.apply(span)
    state.apply(msgspec.structs.replace(span, t=1.5, prefill_s=0.3))
    assert (state.spans.matched, state.spans.unmatched) == (1, 0)
    assert state.turns[-1].engine_prefill_s == 0.25
    assert sum(p == "prefill" for p, _, _ in state.sessions["s1"].waits) == 1
    assert not any("matches no turn" in x.text for x in state.log)


def test_the_sims_span_is_a_child_of_the_span_rampwatch_sent():
    """The simulated engine's span of a request carries the trace id and, as its parent, the span id of the
    request's traceparent (W3C), as vLLM's does; a request without one starts a trace of its own."""
    req = SimEngine(make_profile("tiny")).make_request(b"x" * 64, 4, True)
    req.scheduled_t, req.first_t, req.last_t = req.arrival + 0.1, req.arrival + 0.3, req.arrival + 0.4
    span = request_span(req, "chatcmpl-ab12-s1-t2-a1", traceparent("ab12", "s1", 2, 1))
    assert span is not None
    assert span.trace_id.hex() == trace_id("ab12", "s1", 2) and span.parent_span_id.hex() == span_id("ab12", "s1", 2, 1)
    alone = request_span(req, "chatcmpl-x", None)
    assert alone is not None and len(alone.trace_id) == 16 and alone.parent_span_id == b""


def test_the_sims_front_end_is_the_rest_its_spans_split_off(tmp_path):
    """A simulated engine with a modelled front end (template and tokenizer before the queue: 50 us a prompt
    token, 0.2-0.4 s a turn here): its span's own TTFT counts from before the front end, as vLLM's does, so every
    turn's rest splits into that front end, as modelled, and the client's few milliseconds."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    record = tmp_path / "run.jsonl"
    profile = make_profile("tiny", front_end_token_s=50e-6)
    with ThreadedSim(profile, per_request_metrics=True, otlp_traces_endpoint=endpoint) as sim:
        p = rw(*small_run(sim.url, "--otlp", str(port), "--record", str(record), schedule="4k,8k"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    turns = report_json(record)["sessions"][0]["turns"]
    for t in turns:
        modelled = t["context_tokens"] * 50e-6
        assert t["ttft_front_end_s"] == pytest.approx(modelled, abs=0.05), t
        assert -0.005 < t["ttft_client_s"] < 0.1, t
        assert t["ttft_front_end_s"] + t["ttft_client_s"] == pytest.approx(t["ttft_rest_s"], abs=1e-9)
    assert "front end" in rw("report", str(record)).stdout
