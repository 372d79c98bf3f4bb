"""The simulated engine: scheduler, prefix cache, HTTP surface, and its
calibrated phenomena checked end to end through rampwatch's own driver."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest

from rampwatch.drivers.client.ramp import SEED_SCHEDULE
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.sim.clock import VirtualClock
from rampwatch.drivers.sim.engine import SimEngine, reply_words, token_ids
from rampwatch.drivers.sim.kvcache import KVPool
from rampwatch.drivers.sim.profiles import PROFILES, make_profile
from rampwatch.drivers.telemetry.metrics import normalize
from tests import procs
from tests.conftest import drive
from tests.simhost import ThreadedSim


def test_naming_and_configuring_the_simulator_does_not_import_the_asgi_stack():
    """A command that only names a topology, binds sockets or sets fault knobs stays cheap to start."""
    cheap = ["profiles", "topology", "sockets", "faults", "gpus", "kvcache", "engine"]
    code = (
        "import sys\n"
        + "".join(f"import rampwatch.drivers.sim.{m}\n" for m in cheap)
        + "print(sorted(m for m in ('uvicorn', 'starlette', 'prometheus_client', 'httpx') if m in sys.modules))"
    )
    out = procs.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    # ... and the module that serves does pull it in, so the check above can tell the two apart.
    served = procs.run(
        [sys.executable, "-c", "import sys, rampwatch.drivers.sim.app; print('starlette' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.stdout.strip() == "True", served.stderr


def test_step_time_grows_with_context_and_tokens():
    p = PROFILES["glm-like"]
    shallow = p.step_time([(0, 2048)], [])
    deep = p.step_time([(800_000, 2048)], [])
    assert deep > shallow > 0
    # A decode step that carries a prefill chunk takes as long as the chunk.
    assert p.step_time([(300_000, 511)], [300_000]) > 5 * p.step_time([], [300_000])


def test_glm_like_calibration_figures():
    p = PROFILES["glm-like"]

    def prefill(start: int, n: int) -> float:
        t, pos = 0.0, start
        while pos < start + n:
            c = min(p.max_num_batched_tokens, start + n - pos)
            t, pos = t + p.step_time([(pos, c)], []), pos + c
        return t

    assert 79 <= prefill(131_072, 131_072) <= 88 * 1.02
    assert 79 <= prefill(786_432, 131_072) <= 88 * 1.02
    assert prefill(0, 1_000_000) == pytest.approx(628, rel=0.02)
    assert 1 / p.step_time([], [1_000_000]) == pytest.approx(34.7, rel=0.02)


def test_kv_pool_prefix_cache_and_lru():
    pool = KVPool(num_blocks=4, block_size=16)
    a = pool.allocate(2)
    pool.register(a[0], b"h0")
    pool.register(a[1], b"h1")
    pool.release(a)
    assert pool.used == 0 and pool.free == 4
    assert pool.match([b"h0", b"h1", b"h2"]) == a  # found again, now held
    pool.release(a)
    got = pool.allocate(3)  # two never-used blocks, then the least recently freed: the tail, freed first
    assert got is not None and pool.match([b"h0", b"h1"]) == [a[0]]  # the head is evicted last
    assert pool.allocate(2) is None  # full
    pool.release([a[0], *got])  # freed tail first, so what was evicted next is got's last block, then back to h0
    assert pool.allocate(3) == got[::-1] and pool.match([b"h0"]) == [a[0]]


async def _finish(engine: SimEngine, req):
    task = asyncio.create_task(engine.run())
    engine.submit(req)
    while not req.finished:
        await asyncio.sleep(0.001)
    task.cancel()
    return req


async def test_growing_conversation_reuses_its_blocks():
    engine = SimEngine(PROFILES["tiny"].scaled(step_overhead_s=0.0, decode_token_s=0.0, prefill_token_s=0.0))
    first = b"x" * 4000
    r1 = await _finish(engine, engine.make_request(first, 4, ignore_eos=True))
    assert r1.cached_tokens == 0 and r1.generated == 4
    r2 = await _finish(engine, engine.make_request(first + b"y" * 400, 4, ignore_eos=True))
    assert r2.cached_tokens == (1000 // 16) * 16
    assert engine.pool.used == 0


@pytest.mark.parametrize("burst", [1, 8])
async def test_a_request_holds_its_prompt_and_its_reply_but_the_last_token(burst):
    """As vLLM allocates slots: 100 prompt tokens and 29 generated need the KV of 128 (the last token sampled is
    never computed), 8 blocks of 16, however many tokens a step emits."""
    p = PROFILES["tiny"].scaled(step_overhead_s=0.0, decode_token_s=0.0, prefill_token_s=0.0, burst=burst)
    engine = SimEngine(p)
    await _finish(engine, engine.make_request(b"x" * 400, 29, ignore_eos=True))
    assert engine.pool.num_blocks - engine.pool.never_used == 8


async def test_preemption_when_the_pool_runs_out():
    p = PROFILES["tiny"].scaled(
        kv_tokens=2048, block_size=16, step_overhead_s=0.0005, decode_token_s=0.0, prefill_token_s=0.0
    )
    engine = SimEngine(p)
    preempted = []
    engine.stats.on_preempt = preempted.append
    task = asyncio.create_task(engine.run())
    reqs = [engine.make_request(bytes([65 + i]) * 4000, 200, ignore_eos=True) for i in range(2)]
    for r in reqs:
        engine.submit(r)
    while not all(r.finished for r in reqs):
        await asyncio.sleep(0.001)
    task.cancel()
    assert preempted and all(r.generated == 200 for r in reqs)


def test_schedule_puts_decodes_first_and_chunks_prefill():
    engine = SimEngine(PROFILES["tiny"])
    dec = engine.make_request(b"d" * 400, 10, ignore_eos=True)
    engine.running.append(dec)
    dec.computed, dec.generated, dec.first_t = dec.prompt_tokens, 1, 1.0
    dec.blocks = engine.pool.allocate(8)
    long = engine.make_request(b"p" * 40_000, 10, ignore_eos=True)
    engine.submit(long)
    prefills, decodes = engine.schedule()
    assert decodes == [dec]
    assert prefills == [(long, PROFILES["tiny"].max_num_batched_tokens - 1)]


def test_reply_answers_the_needle_only_when_the_fact_is_there():
    prompt = (
        b"<|user|>\nblah Remember this fact: the access code of Ilsa Ko is AB12-CD34.\nmore\n\n"
        b"Question: what is the access code of Ilsa Ko? Answer with the code only.\n<|assistant|>\n"
    )
    words, ends = reply_words(prompt, 0)
    assert "".join(words).endswith("AB12-CD34.") and ends
    words, ends = reply_words(prompt.replace(b"AB12-CD34", b""), 0)
    assert "AB12" not in "".join(words) and not ends


def test_http_surface(sim):
    url = sim.url
    models = httpx.get(url + "/v1/models").json()["data"][0]
    assert models["owned_by"] == "rampwatch-sim" and models["max_model_len"] == PROFILES["tiny"].max_model_len
    assert "simulated" in httpx.get(url + "/version").json()["version"]
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.post(url + "/tokenize", json={"prompt": "abcdefgh"}).json()["count"] == 2
    assert httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()["count"] > 1
    too_long = httpx.post(
        url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 200_000}], "max_tokens": 8}
    )
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
    assert httpx.post(url + "/v1/chat/completions", content=b"{nope").status_code == 400
    assert (
        httpx.post(
            url + "/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]}
        ).status_code
        == 404
    )
    plain = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, "ignore_eos": True},
    ).json()
    assert plain["usage"]["completion_tokens"] == 5 and plain["choices"][0]["message"]["content"]
    comp = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "ignore_eos": True}).json()
    assert comp["usage"]["completion_tokens"] == 3
    engine, values, missing = normalize(httpx.get(url + "/metrics").text)
    assert engine == "vllm" and not missing and values["kv_capacity_tokens"] == PROFILES["tiny"].kv_tokens
    assert values["generation_tokens"] == 8
    text = httpx.get(url + "/metrics").text
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:request_prefill_time_seconds_bucket",
        "vllm:request_decode_time_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        'simulated="True"',
    ):
        assert name in text


def test_faults_endpoint(sim):
    r = httpx.post(sim.url + "/sim/faults", json={"fail_requests": 1, "fail_status": 503})
    assert r.json()["fail_requests"] == 1
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert httpx.post(sim.url + "/v1/chat/completions", json=body).status_code == 503
    assert httpx.post(sim.url + "/v1/chat/completions", json=body).status_code == 200
    assert httpx.post(sim.url + "/sim/faults", json={"bogus": 1}).status_code == 400


# -- the phenomena, through rampwatch's own driver --------------------------------

SCALE = 200.0  # glm-like, 200x faster than real time


def engine_ttfts(sim: ThreadedSim, kv_at_first: list[float] | None = None) -> list[float]:
    """Every request's TTFT on the engine's own clock (arrival to first token), in order (and, into
    `kv_at_first`, the KV pool's usage at each first token). The client's TTFT adds this process's CPU
    time for 4 MB prompts, which a loaded machine stretches; the model is checked on the engine's clock."""
    out: list[float] = []
    engine = sim.sim.engine
    stats = engine.stats
    first = stats.on_first

    def on_first(r) -> None:  # noqa: ANN001
        out.append(r.first_t - r.arrival)
        if kv_at_first is not None:
            kv_at_first.append(engine.pool.usage())
        first(r)

    stats.on_first = on_first
    return out


def test_one_session_seed_ramp_matches_the_model():
    """The model on the engine's virtual clock: what it predicts for each turn no longer moves with the machine's
    load (the client's view of the same ramp is tests/bench_experiments.py's and test_two_sessions_interfere's)."""
    with ThreadedSim(make_profile("glm-like", time_scale=SCALE), clock=VirtualClock()) as s:
        kv: list[float] = []
        engine = engine_ttfts(s, kv)
        run = drive(s.url, schedule=list(SEED_SCHEDULE), output_tokens=32, ignore_eos=True)
        rep = build_report(run.state)
        oneshot = drive(s.url, schedule=[1_000_000], output_tokens=8, ignore_eos=True)
        kv_at_1m = kv[9]  # the engine's own pool as turn 10 (1M) starts to decode
    assert run.exit_code == 0 and oneshot.exit_code == 0
    rows = rep.sessions[0].turns
    assert [r.needle for r in rows] == [True] * 10
    assert len(engine) == 11
    ttfts = engine[:10]
    per_new = [t / r.new_tokens for t, r in zip(ttfts[3:9], rows[3:9])]  # turns 4-9 add 131,072 tokens each
    assert max(ttfts[3:9]) / min(ttfts[3:9]) < 1.25, ttfts
    assert max(per_new) / min(per_new) < 1.25
    total, one = sum(ttfts), engine[10]
    assert total == pytest.approx(one, rel=0.15), (total, one)
    assert rows[0].hit_rate == 0.0 and rows[-1].hit_rate > 0.9
    # At 1M the live sequence holds ~1M of the pool's 5.92M tokens (block rounding aside).
    assert kv_at_1m == pytest.approx(1_000_000 / PROFILES["glm-like"].kv_tokens, rel=0.1)


@pytest.mark.serial  # a TTFT ratio and the client's overhead on the wall clock
def test_two_sessions_interfere():
    # 50x: slow enough that a decode step alone is well above the process's own overhead.
    with ThreadedSim(make_profile("glm-like", time_scale=50.0)) as s:
        run = drive(s.url, sessions=2, schedule=[65_536, 131_072, 196_608], output_tokens=64, ignore_eos=True)
        server_metrics = httpx.get(s.url + "/metrics").text
    assert run.exit_code == 0
    rep = build_report(run.state)
    a, b = (sess.turns[0].ttft_s for sess in rep.sessions)  # turn 1: both sent together, both prefill
    # The second waits for the first's prefill: ~2x on an idle machine. The lower bound leaves room for a loaded
    # one, whose overhead adds to both (1.56 seen beside two other suites); test_experiments pins the exact
    # ratio on the engine's virtual clock.
    assert 1.3 <= max(a, b) / min(a, b) <= 2.4, (a, b)
    i = rep.interference
    assert i.overlapping_turns > 0
    assert i.decode_tok_s_during_foreign_prefill_median < i.decode_tok_s_alone_median / 3
    # The client's TTFTs agree with the engine's own histogram (same requests, same order).
    _, values, _ = normalize(server_metrics)
    client_sum = sum(r.ttft for r in run.state.turns)
    assert values["ttft_count"] == 6
    assert client_sum >= values["ttft_sum"]
    assert client_sum - values["ttft_sum"] < 0.05 * values["ttft_sum"] + 0.05 * 6


def finished(metrics: str) -> bool:
    """Whether the engine's /metrics count one finished request and none running."""
    values = normalize(metrics)[1]
    return values.get("running") == 0 and (values.get("requests") or 0) >= 1


def test_a_slow_reader_gets_every_token_of_a_stream_that_ended_while_it_lagged():
    """The engine may finish a request while its stream waits on the client's socket; the words it emitted
    meanwhile still go out (they were dropped once: the client counted a quarter of a long reply's chunks)."""
    import argparse
    import json
    import time

    from rampwatch.drivers.sim.serve import ChildSim

    body = {
        "messages": [{"role": "user", "content": "x " * 100}],
        "max_tokens": 100_000,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with ChildSim(argparse.Namespace(profile="fast", step_ms=None)) as sim:
        with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body, timeout=60) as r:
            # Not read until the engine has finished the request, far ahead of this reader, its socket full.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not finished(httpx.get(sim.url + "/metrics").text):
                time.sleep(0.2)
            words, usage = 0, None
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    words += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
                    usage = chunk.get("usage") or usage
    assert usage is not None and usage["completion_tokens"] == 100_000
    assert words == 100_000


def test_token_ids_read_each_tokens_bytes_as_a_little_endian_number():
    """The one-call ids equal each `chars_per_token` bytes read on their own, the last, short one too."""
    data = bytes(range(7, 250, 3))
    for cpt in range(1, 9):
        for n in range(len(data) + 1):
            expected = [int.from_bytes(data[i : min(n, i + cpt)], "little") for i in range(0, n, cpt)]
            assert token_ids(data[:n], cpt) == expected, (cpt, n)


def test_a_run_of_repeating_events_is_the_events_in_turn():
    from rampwatch.drivers.sim.repeating import RepeatingEvents

    events = [b"<%d>" % i * (i % 3 + 1) for i in range(7)]  # of different lengths
    repeating = RepeatingEvents(events)
    for k in (0, 3, 6, 7, 30):
        for count in (0, 1, 6, 7, 8, 20, 71):
            assert repeating.events(k, count) == b"".join(events[(k + j) % 7] for j in range(count)), (k, count)
