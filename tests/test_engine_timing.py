"""The engine's own account of every turn (issue 19): vLLM's per-request metrics parsed and recorded, every request
named to the engine (X-Request-Id, traceparent), each TTFT split into queued + engine prefill + the rest, and the
simulated engine's exact figures from its own scheduler."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import msgspec
import pytest

from rampwatch.drivers.client.chat import ChatStreamParser
from rampwatch.drivers.client.request_ids import id_headers, request_id, span_id, trace_id, traceparent
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.ttft_split import CLOCK_TOLERANCE_S, ttft_split, wait_parts
from rampwatch.drivers.model.turn_row import turn_row
from rampwatch.drivers.model.turns import TurnRecord
from rampwatch.drivers.present.turn_text import split_text, turn_line
from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
from tests.conftest import report_json, rw, small_run
from tests.simhost import CaptureRelay, ThreadedSim
from tests.test_request_options import chat_requests

# The usage chunk of vLLM 0.32 started with --enable-per-request-metrics (ENGINES.md §1.9: the metrics object as
# captured there), with speculative_decoding in the shape of vLLM's SpeculativeDecodingMetrics (§1.10's counts).
VLLM_USAGE_CHUNK = (
    b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[],'
    b'"usage":{"prompt_tokens":3026,"total_tokens":3042,"completion_tokens":16,'
    b'"prompt_tokens_details":{"cached_tokens":0}},'
    b'"metrics":{"time_to_first_token_ms":486.07,"generation_time_ms":21.65,"queue_time_ms":0.053,'
    b'"mean_itl_ms":3.09,"tokens_per_second":26.87,"speculative_decoding":{"mean_acceptance_length":3.6,'
    b'"draft_acceptance_rate":0.99,"acceptance_histogram":[0,1,0,52],"num_spec_steps":53,'
    b'"num_accepted_draft_tokens":138,"num_draft_tokens":139,"num_spec_tokens":3}}}\n\n'
)
TEXT_CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":" wrap"},"finish_reason":null}]}\n\n'


def parsed(*chunks: bytes):
    p = ChatStreamParser(lambda t: None, lambda times, counts, piled: None)
    for k, c in enumerate(chunks):
        p.feed(c, float(k))
    p.feed(b"data: [DONE]\n\n", 9.0)
    return p.finish()


def test_vllm_per_request_metrics_are_read_in_seconds():
    res = parsed(TEXT_CHUNK, VLLM_USAGE_CHUNK)
    assert res.queued_s == pytest.approx(0.000053)
    assert res.engine_prefill_s == pytest.approx(0.48607)
    assert res.engine_decode_s == pytest.approx(0.02165)
    assert res.spec is not None
    assert (res.spec.num_accepted_draft_tokens, res.spec.num_draft_tokens, res.spec.num_spec_steps) == (138, 139, 53)
    assert res.prompt_tokens == 3026 and res.cached_tokens == 0


def test_without_the_flag_nothing_is_invented():
    res = parsed(TEXT_CHUNK, VLLM_USAGE_CHUNK.replace(b',"metrics":', b',"other":'))
    assert res.queued_s is None and res.engine_prefill_s is None and res.spec is None


def record(ttft: float, queued: float | None, prefill: float | None, **more) -> TurnRecord:
    rec = TurnRecord(session="s1", turn=1, target=1000, new_tokens_est=1000, sent_t=10.0, first_t=10.0 + ttft)
    rec.status, rec.prompt_tokens, rec.queued_s, rec.engine_prefill_s = "ok", 1000, queued, prefill
    for k, v in more.items():
        setattr(rec, k, v)
    return rec


def test_the_ttft_reads_as_queued_plus_prefill_plus_the_rest():
    line = turn_line(record(114.8, 57.1, 57.2))
    assert "TTFT 114.80s = queued 57.10 + prefill 57.20 + 0.50" in line
    row = turn_row(record(114.8, 57.1, 57.2))
    assert row.ttft_rest_s == pytest.approx(0.5) and row.queued_s == 57.1 and row.engine_prefill_s == 57.2
    assert "server_prefill_s" not in row.__struct_fields__  # one name for the engine's prefill (schema 7)
    # llama.cpp: its prompt time, the queue unknown.
    assert "TTFT 1.00s = prefill 0.90 + 0.10" in turn_line(record(1.0, None, 0.9))
    # No engine figure: the TTFT alone.
    assert (
        "TTFT 1.00s  " in turn_line(record(1.0, None, None)) and turn_row(record(1.0, None, None)).ttft_rest_s is None
    )


def test_engine_figures_beyond_the_ttft_are_called_wrong():
    ok = ttft_split(1.0, 0.5, 0.5 + CLOCK_TOLERANCE_S * 0.8)
    assert ok is not None and not ok.contradicts and "wrong" not in split_text(1.0, ok)
    bad = split_text(1.0, ttft_split(1.0, 0.5, 0.6))
    assert "prefill 0.60 - 0.10" in bad and "engine exceeds TTFT by 100 ms: clocks or matching wrong" in bad


def test_the_engines_own_ttft_splits_the_rest_into_front_end_and_client():
    """vLLM's span gives its own TTFT from the request's arrival: the rest (client TTFT - queued - prefill)
    splits into the server's front end (engine TTFT - queued - prefill) and the client's side (client TTFT -
    engine TTFT), everywhere the rest shows: the row, the line and the drawn wait."""
    rec = record(1.0, 0.1, 0.6, engine_ttft_s=0.99)
    row = turn_row(rec)
    assert row.ttft_rest_s == pytest.approx(0.3)
    assert row.ttft_front_end_s == pytest.approx(0.29) and row.ttft_client_s == pytest.approx(0.01)
    assert row.ttft_front_end_s + row.ttft_client_s == pytest.approx(row.ttft_rest_s)
    line = turn_line(rec)
    assert "TTFT 1.00s = queued 0.10 + prefill 0.60 + front end 0.29 + client 0.010" in line
    parts = wait_parts(rec)
    assert parts is not None and [p for p, _, _ in parts] == ["client", "front end", "queued", "prefill"]
    assert [round(b - a, 6) for _, a, b in parts] == [0.01, 0.29, 0.1, 0.6]
    # Without the span the rest stays one figure, drawn as one part.
    plain = record(1.0, 0.1, 0.6)
    assert turn_row(plain).ttft_client_s is None and "front end" not in turn_line(plain)
    assert [p for p, _, _ in wait_parts(plain) or []] == ["rest", "queued", "prefill"]
    # An engine TTFT beyond the client's is a contradiction (clocks or matching), said as such.
    wrong = ttft_split(1.0, 0.1, 0.6, engine_ttft_s=1.2)
    assert wrong is not None and wrong.contradicts and "matching wrong" in split_text(1.0, wrong)


def test_speculative_acceptance_reads_per_turn():
    rec = record(1.0, 0.0, 0.9, spec_accepted=138, spec_drafted=139, spec_steps=53)
    assert "spec 138/139 accepted, mean length 3.60" in turn_line(rec)
    assert turn_row(rec).spec_accepted == 138 and turn_row(rec).spec_drafted == 139


def test_old_recordings_load_without_the_new_fields():
    done = msgspec.json.decode(b'{"type":"TurnDone","t":1.0,"session":"s1","turn":1,"status":"ok"}', type=ev.AnyEvent)
    sent = msgspec.json.decode(
        b'{"type":"RequestSent","t":0.0,"session":"s1","turn":1,"target_tokens":8,"new_tokens_est":8,"body_bytes":9}',
        type=ev.AnyEvent,
    )
    assert done.queued_s is None and done.spec_accepted is None and sent.request_id == ""


def test_request_ids_name_the_attempt_and_the_trace_the_turn():
    assert request_id("ab12", "s2", 3, 1) == "ab12-s2-t3-a1"
    tp = traceparent("ab12", "s2", 3, 2)
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", tp)
    assert trace_id("ab12", "s2", 3) == tp.split("-")[1]  # every attempt at a turn shares its trace ...
    assert span_id("ab12", "s2", 3, 1) != span_id("ab12", "s2", 3, 2)  # ... each has its own span
    assert trace_id("ab12", "s2", 3) != trace_id("ab12", "s2", 4) != trace_id("ab12", "s1", 4)
    # The user's own X-Request-Id (--header, any case) is what the engine knows the request by.
    added, rid = id_headers({"x-request-id": "mine-7"}, "ab12", "s1", 1, 1)
    assert rid == "mine-7" and "X-Request-Id" not in added and "traceparent" in added


def run_through_relay(rec: Path, *extra: str) -> tuple[list[tuple[dict[str, str], dict]], CaptureRelay]:
    """A small recorded run with `extra` flags against the tiny sim behind a relay: the chat requests that
    reached the server (headers, body) and the relay that saw them."""
    with ThreadedSim(make_profile("tiny")) as sim, CaptureRelay(sim.url) as relay:
        p = rw(*small_run(relay.url, "--record", str(rec)), *extra)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return chat_requests(relay), relay


def test_every_request_carries_its_ids_to_the_server_and_the_recording(tmp_path):
    rec = tmp_path / "run.jsonl"
    chats, _ = run_through_relay(rec, "--sessions", "2")
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    salt = lines[0]["salt"]
    sent = {(e["session"], e["turn"]): e["request_id"] for e in lines if e.get("type") == "RequestSent"}
    assert sent == {(s, t): f"{salt}-{s}-t{t}-a1" for s in ("s1", "s2") for t in (1, 2)}
    assert sorted(h["x-request-id"] for h, _ in chats) == sorted(sent.values())
    for h, _ in chats:
        _, s, t, a = h["x-request-id"].rsplit("-", 3)
        assert h["traceparent"] == traceparent(salt, s, int(t[1:]), int(a[1:]))


def test_a_users_own_request_id_wins(tmp_path):
    rec = tmp_path / "run.jsonl"
    chats, relay = run_through_relay(rec, "--header", "x-request-id: me-{session}-{turn}")
    assert sorted(h["x-request-id"] for h, _ in chats) == ["me-s1-1", "me-s1-2"]
    assert all(raw.lower().count(b"x-request-id:") == 1 for raw in relay.requests_to("/v1/chat/completions"))
    sent = [json.loads(x) for x in rec.read_text().splitlines() if '"RequestSent"' in x]
    assert [e["request_id"] for e in sent] == ["me-s1-1", "me-s1-2"]


def test_without_engine_figures_one_line_names_the_flag(sim, tmp_path):
    rec = tmp_path / "run.jsonl"
    p = rw(*small_run(sim.url, "--record", str(rec)))
    assert p.returncode == 0, p.stderr[-2000:]
    text = rw("report", str(rec)).stdout
    assert (
        "engine's own queue and prefill time per turn unavailable (vLLM: --enable-per-request-metrics, "
        "or its OTLP spans to rampwatch --otlp)" in text
    )
    turns = report_json(rec)["sessions"][0]["turns"]
    assert all(t["queued_s"] is None and t["engine_prefill_s"] is None and t["ttft_rest_s"] is None for t in turns)


# The engine's figures account for the client's TTFT within 5 ms (issue 19): what is left on a loopback port is the
# client's send, the sim's HTTP parsing and the chunk's way back (measured: 1-5 ms a turn, the odd turn 6-9 ms on a
# quiet machine). That 5 ms is a bar that tests/bench_experiments.py prints the figure for. A time slice either
# process waits on 2 shared cores is no offset in the engine's figures, and under two suites at once one turn's rest
# was 55-107 ms: so the test holds the median only, where a real offset (the sim's loop held 40-70 ms by an import on
# its first stream, pinned by test_the_sims_first_stream_waits_for_no_import) would show on every turn.
REST_MEDIAN_MAX_S = 0.010


@pytest.mark.serial  # holds the client's rest of the TTFT to 10 ms
def test_demo_lockstep_one_session_queued_behind_the_others_prefill(tmp_path):
    """`rampwatch demo` (two sessions in lockstep, the simulated engine in its own process timing each request): on
    every turn one session waits in the engine's queue about as long as the other's prefill, the three parts add up
    to the client's TTFT, and the report says how much of the slow session's extra wait was queueing."""
    rec = tmp_path / "demo.jsonl"
    p = rw(
        "demo",
        "--headless",
        "--schedule",
        "8k,16k,24k",
        "--time-scale",
        "5",
        "--output-tokens",
        "8",
        "--record",
        str(rec),
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert re.search(r"TTFT [\d.]+s = queued [\d.]+ \+ prefill [\d.]+ \+ [\d.]+", p.stdout), p.stdout[-2000:]
    rep = report_json(rec)
    # The report's times are the modelled engine's (5x the wall clock); the client's rest is wall time: back to it.
    # The demo's engine models a front end (its spans' TTFT counts from before it): the client's part is the rest less
    # that, where the span came.
    k = rep["run"]["time_scale"]
    assert k == 5.0
    by_turn: dict[int, list[dict]] = {}
    for sess in rep["sessions"]:
        for t in sess["turns"]:
            by_turn.setdefault(t["turn"], []).append(t)
    assert sorted(by_turn) == [1, 2, 3]
    rests = []
    for turn, rows in by_turn.items():
        fast, slow = sorted(rows, key=lambda r: r["ttft_s"])
        for r in rows:
            assert r["ttft_rest_s"] / k >= -CLOCK_TOLERANCE_S, (turn, r)
            assert r["ttft_client_s"] is not None, r  # the demo's spans split every rest
            rest = r["ttft_client_s"] / k  # in wall seconds: the client's own clock
            assert rest >= -CLOCK_TOLERANCE_S, (turn, r)
            if not r["client_busy"]:  # a stamp taken while the driver's loop ran late may be late by as much
                rests.append(rest)
        assert slow["queued_s"] == pytest.approx(fast["engine_prefill_s"], rel=0.2), (turn, slow, fast)
        assert fast["queued_s"] < slow["queued_s"], (turn, slow, fast)
    i = rep["interference"]
    assert i["extra_wait_queued_s"] == pytest.approx(i["extra_wait_s"], rel=0.2), i
    for sess in rep["sessions"]:
        m = sess["summary"]
        assert m["queued_sum_s"] == pytest.approx(sum(t["queued_s"] for t in sess["turns"]))
        assert m["engine_prefill_sum_s"] == pytest.approx(sum(t["engine_prefill_s"] for t in sess["turns"]))
    text = rw("report", str(rec), env={"COLUMNS": "250"}).stdout
    said = r"interference: the slowest session waited [\d.]+s longer in all, [\d.]+s \(\d+%\) of it queued"
    assert re.search(said, text), text
    assert "engine: queued" in text and "rest s" in text and "unavailable (vLLM" not in text
    rests.sort()
    print(f"client's rest of the TTFT: median {rests[len(rests) // 2] * 1000:.1f} ms, max {rests[-1] * 1000:.1f} ms")
    assert rests[len(rests) // 2] <= REST_MEDIAN_MAX_S, rests


SPEC_SCRAPE = """# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} DRAFTED
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} ACCEPTED
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 1.0
"""


def test_the_server_panel_shows_speculative_acceptance_live():
    from rampwatch.drivers.model.state import RunState
    from rampwatch.drivers.telemetry.metrics import normalize
    from rampwatch.tui.widgets.server import spec_line

    state = RunState()
    for t, (drafted, accepted) in enumerate([(100.0, 90.0), (239.0, 228.0)]):
        engine, values, missing = normalize(
            SPEC_SCRAPE.replace("DRAFTED", str(drafted)).replace("ACCEPTED", str(accepted))
        )
        assert "spec_drafted" not in missing and values["spec_drafted"] == drafted
        state.apply(ev.MetricsSample(t=float(t), source="e", engine=engine, values=values, missing=missing))
    line = spec_line(state.server.values, 12.5)
    assert line is not None and line.plain == "spec decode accepted 138/139 draft tokens (99%) · decode 12 tok/s"
    _, values, missing = normalize('vllm:num_requests_running{engine="0"} 1.0\n')
    assert "spec_drafted" not in values and "spec_drafted" not in missing  # a server that does not speculate


def test_the_sims_first_stream_waits_for_no_import():
    """Starlette streams through an anyio task group whose asyncio backend anyio imports on first use (40-70 ms
    with the sim's loop held, measured): the first turn's TTFT then exceeded the engine's figures by ~30 ms.
    The sim imports it as it starts, before any request."""
    code = (
        "import asyncio, sys\n"
        "from rampwatch.drivers.sim.app import SimServer\n"
        "from rampwatch.drivers.sim.profiles import make_profile\n"
        "async def main():\n"
        "    s = SimServer(make_profile('tiny'))\n"
        "    async with s.app.router.lifespan_context(s.app):\n"
        "        print('anyio._backends._asyncio' in sys.modules)\n"
        "asyncio.run(main())\n"
    )
    out = procs.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stdout + out.stderr
