"""Against a real vLLM CPU server (tiny random-weight Llama made by the fixture).

A random model cannot find a needle, so the needle path is tested against the
simulated engine (test_sim.py); everything else is checked here."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from rampwatch.drivers.client.ramp import SEED_SCHEDULE, scale_schedule
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.proxy import PdProxy
from rampwatch.drivers.telemetry.metrics import SAMPLE_LINE, normalize, parse_labels
from tests.conftest import drive, run_against_real_server
from tests.simhost import ThreadedServer

pytestmark = pytest.mark.vllm


def ttft_histogram(text: str) -> tuple[float, float, dict[float, float]]:
    """(sum, count, {le: cumulative count}) of vllm:time_to_first_token_seconds."""
    total = count = 0.0
    buckets: dict[float, float] = {}
    for m in SAMPLE_LINE.finditer(text):
        name = m.group(1)
        if name == "vllm:time_to_first_token_seconds_sum":
            total += float(m.group(3))
        elif name == "vllm:time_to_first_token_seconds_count":
            count += float(m.group(3))
        elif name == "vllm:time_to_first_token_seconds_bucket":
            le = float(parse_labels(m.group(2))["le"])
            buckets[le] = buckets.get(le, 0.0) + float(m.group(3))
    return total, count, buckets


def kv_block_size(url: str) -> int:
    """The server's KV block size, from vllm:cache_config_info's labels."""
    for m in SAMPLE_LINE.finditer(httpx.get(url + "/metrics").text):
        if m.group(1) == "vllm:cache_config_info":
            return int(parse_labels(m.group(2))["block_size"])
    raise AssertionError(f"{url}/metrics has no vllm:cache_config_info")


class LoopbackNoise:
    """While the run goes, the slowest answer to GET /health from the same server: how late this
    shared machine (another process loading the CPU included) can deliver a ready response."""

    def __init__(self, url: str):
        self.url, self.worst, self._stop = url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._measure, daemon=True)

    def _measure(self) -> None:
        with httpx.Client() as c:
            while not self._stop.wait(0.1):
                t0 = time.perf_counter()
                try:
                    c.get(self.url + "/health", timeout=10)
                except httpx.HTTPError:
                    continue
                self.worst = max(self.worst, time.perf_counter() - t0)

    def __enter__(self) -> LoopbackNoise:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_two_session_ramp_against_vllm(vllm_server, tmp_path):
    url = vllm_server
    before = ttft_histogram(httpx.get(url + "/metrics").text)
    schedule = scale_schedule(SEED_SCHEDULE, 32_768)
    rec = tmp_path / "vllm.jsonl"
    with LoopbackNoise(url) as noise:
        run = drive(url, sessions=2, schedule=schedule, output_tokens=64, ignore_eos=True, record=rec)
    after_text = httpx.get(url + "/metrics").text
    after = ttft_histogram(after_text)
    assert run.exit_code == 0
    rep = build_report(run.state)
    assert rep.run.engine == "vllm" and rep.run.model == "tiny"

    for sess in rep.sessions:
        rows = sess.turns
        assert [r.turn for r in rows] == list(range(1, 11)) and not any(r.error for r in rows)
        for r, target in zip(rows, schedule):
            assert r.context_tokens == pytest.approx(target, rel=0.02), (sess.id, r.turn, r.context_tokens, target)
            assert r.output_tokens == 64
        # Turn 1 is counted by the server before it goes and fitted: within a cut word's pieces.
        assert rows[0].context_tokens == pytest.approx(schedule[0], abs=4), (sess.id, rows[0].context_tokens)
        assert all(r.cached_tokens and r.cached_tokens > 0 for r in rows[1:])
        hits = [r.hit_rate for r in rows]
        assert hits[0] == 0.0 and hits[-1] > hits[1] and hits[-1] > 0.85
        # Turns 2-4 double the context (about half cached); from turn 4 on each adds the same, so the share rises.
        assert all(0.35 < h < 0.65 for h in hits[1:4]), hits
        assert all(b > a for a, b in zip(hits[3:], hits[4:])), hits

    # The client's clock starts before the server's and ends after it.
    client = sorted(r.ttft for r in run.state.turns)
    server_sum = after[0] - before[0]
    assert after[1] - before[1] == len(client) == 20
    for le, cum in after[2].items():
        server_le = cum - before[2].get(le, 0.0)
        # Every client TTFT >= its server TTFT, so no more client than server observations under any bound.
        assert server_le >= sum(1 for t in client if t <= le), le
    assert sum(client) >= server_sum
    # The client's clock may run past the server's by its delivery: 50 ms a turn on a quiet machine, plus the
    # slowest loopback answer measured alongside (a loaded CPU delays every delivery alike).
    margin = 0.05 * server_sum + len(client) * (0.050 + noise.worst)
    assert sum(client) - server_sum < margin, (sum(client), server_sum, noise.worst)

    i = rep.interference
    assert i.overlapping_turns > 0
    assert i.decode_tok_s_during_foreign_prefill_median < i.decode_tok_s_alone_median

    # The server panel's figures came from the real exposition.
    _, values, missing = normalize(after_text)
    assert not missing and run.state.server.values["kv_capacity_tokens"] == values["kv_capacity_tokens"]
    assert rep.server.kv_peak is not None and rep.server.kv_peak > 0

    # The recording reports the same numbers as the live run.
    back = read_recording(rec)
    state = RunState(back.header)
    for e in back.events:
        state.apply(e)
    assert build_report(state) == rep


def test_lockstep_one_shot_strict_needle_against_vllm(vllm_server, tmp_path):
    schedule = scale_schedule(SEED_SCHEDULE, 24_576)
    rec = tmp_path / "experiments.jsonl"
    run = drive(
        vllm_server,
        sessions=2,
        schedule=schedule,
        output_tokens=32,
        ignore_eos=True,
        lockstep=True,
        one_shot=True,
        strict_needle=True,
        record=rec,
    )
    assert run.exit_code == 0
    rep = build_report(run.state)
    assert rep.run.status == "done" and rep.run.lockstep and rep.run.needle_mode == "strict" and rep.run.one_shot
    assert [s.summary.reached_turn for s in rep.sessions] == [10, 10]
    # The baseline: as long as the last turn, from a salt no earlier prompt shares (less than one KV block cached).
    shot = rep.one_shot.turn
    assert shot.context_tokens == pytest.approx(schedule[-1], rel=0.02)
    assert shot.cached_tokens is not None and shot.cached_tokens < 16
    # Gaps are the waits between deliveries as the recording has them. On these 2 shared cores (and the suite's
    # other servers) a starved client or API process sometimes gets a whole reply in one read: one delivery, no
    # gap to measure ("-" in the report). Every turn read in two or more has its gaps, and most turns are.
    events = read_recording(rec).events
    deliveries: dict[tuple[str, int], list[float]] = {}
    for e in events:
        if isinstance(e, ev.TokenTimes):
            deliveries.setdefault((e.session, e.turn), []).extend(e.chunk_times())
    measured = 0
    for sess in rep.sessions:
        for r in sess.turns:
            stamps = sorted(set(deliveries[(sess.id, r.turn)]))
            waits = [b - a for a, b in zip(stamps, stamps[1:])]
            if not waits:
                assert r.gap_max_s is None, (sess.id, r.turn)
                continue
            measured += 1
            assert r.gap_max_s == pytest.approx(max(waits)) and r.gap_max_s >= r.gap_p99_s >= r.gap_p50_s > 0, r.turn
    assert measured >= 10, measured  # of 20 turns (20 of 20 on an idle machine)
    for turn in range(2, 11):  # lockstep: no turn left before every session had finished the one before
        sent = min(
            e.t for e in events if type(e).__name__ == "RequestSent" and e.turn == turn and e.session != "one-shot"
        )
        done = max(
            e.t for e in events if type(e).__name__ == "TurnDone" and e.turn == turn - 1 and e.session != "one-shot"
        )
        assert sent >= done
    assert len(rep.turn_spread) == 10


def test_two_vllm_replicas_behind_rampwatchs_own_spreading(vllm_server, vllm_replica, tmp_path):
    """`rampwatch run URL1 URL2 --sessions 4`: two sessions on each real server, each server its own row."""
    rec = tmp_path / "replicas.jsonl"
    servers = (vllm_server, vllm_replica)
    rep = run_against_real_server(
        *servers, "--sessions", "4", "--scale-to", "8k", "--output-tokens", "16", "--ignore-eos", record=rec
    )
    assert [s["summary"]["reached_turn"] for s in rep["sessions"]] == [10] * 4
    names = [urlsplit(u).netloc for u in (vllm_server, vllm_replica)]
    assert sorted(s["name"] for s in rep["servers"]) == sorted(names)  # in the order they first answered
    planned = [e.endpoint for e in read_recording(rec).events if type(e).__name__ == "SessionPlanned"]
    assert planned == [names[0], names[1]] * 2
    # Each real server generated exactly its two sessions' tokens, and the total is their sum.
    for s in rep["servers"]:
        assert s["engine"] == "vllm" and s["generation_tokens"] == 2 * 10 * 16, s
        assert s["hit_rate"] is not None and s["hit_rate"] > 0.5
    assert rep["servers_total"]["generation_tokens"] == 4 * 10 * 16
    assert rep["servers_total"]["prompt_tokens"] == sum(s["prompt_tokens"] for s in rep["servers"])


def test_a_real_prefill_decode_pair_behind_rampwatchs_proxy(vllm_pd, tmp_path):
    """Two real vLLM servers sharing KV through ExampleConnector, rampwatch's prefill/decode proxy in
    front (the one `rampwatch sim --pd` uses): each role its own row, the decode server's prompts reused from its
    own prefix cache or transferred."""
    prefill, decode = vllm_pd
    rec = tmp_path / "pd.jsonl"
    with ThreadedServer(PdProxy(prefill, decode).app) as proxy:
        rep = run_against_real_server(
            proxy.url,
            "--metrics-url",
            f"prefill:p={prefill}/metrics",
            "--metrics-url",
            f"decode:d={decode}/metrics",
            "--scrape-interval",
            "0.1",
            "--sessions",
            "1",
            "--scale-to",
            "12k",
            "--output-tokens",
            "16",
            "--ignore-eos",
            record=rec,
        )
    turns = rep["sessions"][0]["turns"]
    assert [t["turn"] for t in turns] == list(range(1, 11)) and not any(t["error"] for t in turns)
    by_role = {s["role"]: s for s in rep["servers"]}
    pre, dec = by_role["prefill"], by_role["decode"]
    assert (pre["name"], dec["name"]) == ("p", "d")
    assert pre["generation_tokens"] == 10 and dec["generation_tokens"] == 10 * 16  # prefill: max_tokens 1 a turn
    # The decode server loaded each prompt's KV from the prefill server's copy: nearly all of it cached. But
    # ExampleConnector (a debug connector) files a prompt of n tokens under its first (n-1)//B*B tokens and looks
    # one up by its first (n-2)//B*B (it expects the prompt plus one generated token), B the KV block size: a
    # prompt of k*B+1 tokens is never found, and only the decode server's own prefix cache serves it.
    block = kv_block_size(decode)
    unfindable = [t for t in turns if t["context_tokens"] % block == 1]
    for t in turns:
        if t not in unfindable:
            assert t["transferred_tokens"] is not None, t  # some sample after its first token showed it
            assert t["cached_tokens"] + t["transferred_tokens"] >= 0.9 * t["context_tokens"], (t, block)
    computed_for_unfindable = sum(
        t["context_tokens"] - t["cached_tokens"] - t["transferred_tokens"] for t in unfindable
    )
    assert dec["prompt_computed_tokens"] - computed_for_unfindable < 0.1 * pre["prompt_computed_tokens"]
    assert rep["servers_total"]["generation_tokens"] == pre["generation_tokens"] + dec["generation_tokens"]
    # vLLM 0.32's decode server counts the KV ExampleConnector loaded as prompt_tokens_by_source
    # {source="external_kv_transfer"}: rampwatch shows it as transferred, and cached as its own prefix cache's.
    first = turns[0]
    if first not in unfindable:
        assert first["cached_tokens"] <= block and first["transferred_tokens"] >= 0.9 * first["context_tokens"]
    for prev, t in zip(turns, turns[1:]):  # its prefix cache holds the previous turn's prompt and reply
        assert t["cached_tokens"] >= 0.5 * prev["context_tokens"], t
    assert all(t["hit_rate"] == t["cached_tokens"] / t["context_tokens"] for t in turns)
    assert dec["transferred_tokens"] == sum(t["transferred_tokens"] for t in turns)
