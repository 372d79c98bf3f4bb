"""Probing servers of each engine, and the run's auth headers, without a server; a session counting its turns
over its own connection, against the simulated engine."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from rampwatch.drivers.client.ramp import Calibration, Conversation
from rampwatch.drivers.client.session import SessionRunner
from rampwatch.drivers.client.streamer import TurnOptions
from rampwatch.drivers.client.tokenizer import ServerTokenizer, over_connection, over_httpx
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.net.wire import Connection
from rampwatch.drivers.run.config import BadInput, RunConfig
from rampwatch.drivers.run.probe import probe


def client(models: dict, version: int = 404) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=models)
        return httpx.Response(version, json={"version": "1.2.3"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    "entry,engine,max_len",
    [
        ({"id": "m", "owned_by": "vllm", "max_model_len": 131072}, "vllm", 131072),
        ({"id": "m", "owned_by": "sglang", "max_model_len": 65536}, "sglang", 65536),
        ({"id": "m", "owned_by": "llamacpp", "meta": {"n_ctx": 8192, "n_ctx_train": 131072}}, "llama.cpp", 8192),
        ({"id": "m"}, None, None),  # unknown: the report falls back to what /metrics revealed
    ],
)
async def test_probe_reads_each_engine(entry, engine, max_len):
    async with client({"data": [entry]}, version=200) as c:
        info = await probe(c, RunConfig(url="http://x"))
    assert (info.model, info.engine, info.max_model_len, info.engine_version) == ("m", engine, max_len, "1.2.3")


async def test_probe_refuses_unknown_model_and_non_openai():
    async with client({"data": [{"id": "a"}, {"id": "b"}]}) as c:
        with pytest.raises(BadInput, match="'z' is not served .* a, b"):
            await probe(c, RunConfig(url="http://x", model="z"))
    async with client({"hello": 1}) as c:
        with pytest.raises(BadInput, match="not an OpenAI-compatible server"):
            await probe(c, RunConfig(url="http://x"))


def test_auth_headers_and_url_without_credentials():
    cfg = RunConfig(url="http://al%40ice:p%3Ass@host:8000/v1")
    assert cfg.base_url == "http://host:8000"
    assert cfg.headers() == {"Authorization": "Basic " + base64.b64encode(b"al@ice:p:ss").decode()}
    cfg.api_key = "sk-1"
    assert cfg.headers() == {"Authorization": "Bearer sk-1"}


@asynccontextmanager
async def mocked_session(
    sid: str, conv: Conversation, answer: Callable[[httpx.Request], httpx.Response]
) -> AsyncIterator[SessionRunner]:
    """Session `sid` of `conv` against a server whose every answer, /tokenize included, is `answer(request)`."""
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as c:
        runner = SessionRunner(sid, conv, c, "http://x", {}, TurnOptions(model="m"), lambda e: None, RunClock())
        runner.tokenizer.post = over_httpx(c, "http://x", {})  # the server's answers from the mock, not a socket
        yield runner


async def test_a_session_counts_its_own_fixed_text_without_the_servers_bos():
    """Turn 1 has no usage to correct it: each session counts its own salt, fact and question by the
    server's /tokenize (llama.cpp's {"content"} form here, which adds a BOS to any text)."""
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["content"]
        asked.append(text)
        return httpx.Response(200, json={"tokens": [1] + [0] * len(text)})  # a BOS, then a token a character

    cal = Calibration(
        chars_per_token=2.0, template_tokens=5, fixed_tokens=(1, 1), tokenize_field="content", special_tokens=1
    )
    conv = Conversation("run-s2", [1000, 2000], cal)
    async with mocked_session("s2", conv, answer) as runner:
        await runner._measure_fixed_text()
        assert await runner._resent_tokens("four") == 4
    assert asked[:2] == [conv.fixed_text(1), conv.fixed_text(2)]
    assert conv.plan(1) == ((1000 - 5 - len(conv.fixed_text(1))) * 2, 1000)


async def test_turn_one_is_counted_by_the_server_and_fitted_before_it_goes():
    """llama.cpp's forms: /tokenize knows no messages (no tokens), /apply-template gives the prompt, and
    /tokenize {"content"} counts that (a BOS, then a token a character here). The probe's fixed-text count
    (40) is far from this session's (~130), so turn 1 as drawn would be ~90 tokens over; it goes out at 600."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/apply-template":
            return httpx.Response(200, json={"prompt": "<u>" + body["messages"][0]["content"] + "</u>"})
        return httpx.Response(200, json={"tokens": [1] + [0] * len(body["content"]) if "content" in body else []})

    cal = Calibration(
        chars_per_token=1.0, template_tokens=8, fixed_tokens=(40, 20), tokenize_field="content", special_tokens=1
    )
    conv = Conversation("run-s1", [600, 1200], cal)
    async with mocked_session("s1", conv, answer) as runner:
        drawn = 1 + len("<u></u>") + len(_drawn_message(Conversation("run-s1", [600, 1200], cal)))
        user, _ = await runner._user_message(1)
    content = json.loads(user)["content"]
    assert drawn > 680 and 1 + len("<u>" + content + "</u>") == 600
    assert conv.needle.fact() in content and content.endswith(conv.needle.question())


def _drawn_message(conv: Conversation) -> str:
    return "".join(conv.user_message(1, conv.plan(1)[0]))


async def test_a_session_counts_over_its_own_connection_as_httpx_would(sim):
    """The session's /tokenize goes over its streaming connection (no httpx request per turn boundary): the
    same counts as over httpx, a form the server refuses is None, and the connection stays usable."""
    texts = ["", "hello world", "the quick brown fox " * 200]
    async with httpx.AsyncClient() as client:
        by_httpx = ServerTokenizer(over_httpx(client, sim.url, {}), "sim-model")
        want = [await by_httpx.raw(t) for t in texts]
    conn = Connection(sim.url, RunClock())
    try:
        own = ServerTokenizer(over_connection(conn, "", {}), "sim-model")
        assert [await own.raw(t) for t in texts] == want and want[-1] > want[1] > 0
        assert await own._ask({"no such form": "x"}) is None
        assert await own.text("hello world") == want[1]
    finally:
        conn.close()


def test_a_run_freezes_its_setup_while_it_streams_and_unfreezes_at_its_end(monkeypatch):
    """The driver leaves its set-up objects out of the collector while it stamps (a full collection held the loop
    20-40 ms mid-stream), and gives them back when the run ends: a process driving a sweep's points frees each."""
    import gc

    from rampwatch.drivers.sim.profiles import make_profile
    from tests.conftest import drive
    from tests.simhost import ThreadedSim

    frozen: list[int] = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (freeze(), frozen.append(gc.get_freeze_count())))
    with ThreadedSim(make_profile("tiny")) as sim:
        run = drive(sim.url, schedule=[1000, 2000], output_tokens=4)
    assert run.exit_code == 0
    assert len(frozen) == 1 and frozen[0] > 1000, frozen  # the modules and the run's set-up, once
    assert gc.get_freeze_count() == 0


def test_every_reply_but_the_last_is_counted_by_the_server_for_the_turn_that_resends_it(tmp_path):
    """A reply is counted by the server's /tokenize for the next turn's budget; the last turn's reply is re-sent
    by no turn, so it is not counted (a round trip saved, and the server's work: counting 100,000-token replies
    was a quarter of the simulated engine's Python time in the workers' benchmark)."""
    from rampwatch.drivers.model import events as ev
    from rampwatch.drivers.run.recording import read_recording
    from rampwatch.drivers.sim.app import SimServer
    from rampwatch.drivers.sim.profiles import make_profile
    from tests.conftest import drive
    from tests.simhost import ThreadedServer

    sim, tokenized = SimServer(make_profile("tiny")), []

    async def app(scope, receive, send):
        """The simulated server, noting the text of every /tokenize."""
        if scope["type"] == "http" and scope["path"] == "/tokenize":
            messages = [await receive()]
            while messages[-1].get("more_body"):
                messages.append(await receive())
            tokenized.append(json.loads(b"".join(m.get("body", b"") for m in messages)).get("prompt"))
            given = iter(messages)

            async def replay():
                return next(given, None) or await receive()

            return await sim.app(scope, replay, send)
        await sim.app(scope, receive, send)

    record = tmp_path / "r.jsonl"
    with ThreadedServer(app) as server:
        run = drive(server.url, schedule=[1000, 2000, 3000], output_tokens=8, record=record, record_text=True)
    assert run.exit_code == 0
    replies = {e.turn: e.text for e in read_recording(record).events if isinstance(e, ev.TurnDone)}
    assert all(replies.values()) and len(replies) == 3
    # The simulated engine answers each turn's question with the same line: it is counted twice, not thrice.
    assert len(set(replies.values())) == 1
    assert sum(text in replies.values() for text in tokenized) == 2, tokenized


def test_a_read_carrying_many_chunks_is_recorded_as_one_stamp_and_its_count(tmp_path):
    """The 'fast' engine writes its tokens in bursts, which reach the client several to a read: each read is
    recorded once, with how many chunks it carried, and every chunk is still counted (the turns' chunks)."""
    from rampwatch.drivers.model import events as ev
    from rampwatch.drivers.run.recording import read_recording
    from rampwatch.drivers.sim.profiles import make_profile
    from tests.conftest import drive
    from tests.simhost import ThreadedSim

    record = tmp_path / "r.jsonl"
    with ThreadedSim(make_profile("fast", burst=64)) as sim:
        run = drive(sim.url, schedule=[1000, 2000], output_tokens=2000, ignore_eos=True, record=record)
    assert run.exit_code == 0
    events = read_recording(record).events
    stamps: dict[tuple[str, int], int] = {}
    chunks: dict[tuple[str, int], int] = {}
    for e in events:
        if isinstance(e, ev.TokenTimes):
            stamps[(e.session, e.turn)] = stamps.get((e.session, e.turn), 0) + len(e.times)
            chunks[(e.session, e.turn)] = chunks.get((e.session, e.turn), 0) + len(e.chunk_times())
    done = {(e.session, e.turn): e.chunks for e in events if isinstance(e, ev.TurnDone)}
    assert chunks == done and set(done.values()) == {2000}, (chunks, done)
    assert all(stamps[k] < chunks[k] / 4 for k in stamps), stamps  # bursts of 64: far fewer reads than chunks
