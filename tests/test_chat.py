"""SSE parsing and timestamps of the streaming client, on hand-made streams."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from drivers.chat import StreamError, chat_body, encode_message, error_text, stream_chat


def _chunk(**delta) -> bytes:
    return b"data: " + msgspec.json.encode({"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) + b"\n\n"


USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":18,"total_tokens":34,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":16}}}\n\n'
DONE = b"data: [DONE]\n\n"


class Reads(httpx.AsyncByteStream):
    """Yields the given network reads, advancing a fake clock before each."""

    def __init__(self, reads: list[bytes], clock: list[float]):
        self.reads, self.clock = reads, clock

    async def __aiter__(self):
        for r in self.reads:
            self.clock[0] += 1.0
            yield r


async def _run(reads: list[bytes], status: int = 200):
    now = [0.0]
    transport = httpx.MockTransport(lambda req: httpx.Response(status, stream=Reads(reads, now)))
    firsts: list[float] = []
    batches: list[list[float]] = []
    async with httpx.AsyncClient(transport=transport) as client:
        res = await stream_chat(client, "http://x/v1/chat/completions", b"{}", {}, lambda: now[0],
                                firsts.append, batches.append, flush_every=100.0)
    return res, firsts, batches


async def test_prelude_keepalive_and_usage_are_not_tokens():
    reads = [
        _chunk(role="assistant", content=""),  # t=1: role prelude, no token
        b": keep-alive\n\n",  # t=2
        _chunk(content="Hel"),  # t=3: first token
        _chunk(content="lo") + _chunk(content="!"),  # t=4: two chunks in one read
        _chunk(content=None) + b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        USAGE + DONE,
    ]
    res, firsts, batches = await _run(reads)
    assert firsts == [3.0] and res.first_t == 3.0 and res.last_t == 4.0
    assert res.chunks == 3 and res.text == "Hello!"
    assert sum(batches, []) == [3.0, 4.0, 4.0]
    assert (res.prompt_tokens, res.cached_tokens, res.completion_tokens) == (18, 16, 16)


async def test_event_split_across_reads_is_stamped_when_complete():
    whole = _chunk(content="abc")
    reads = [_chunk(role="assistant", content=""), whole[:10], whole[10:], DONE]
    res, firsts, _ = await _run(reads)
    assert firsts == [3.0]  # the read that completed the event


async def test_reasoning_counts_as_a_token_and_crlf_framing_works():
    reads = [_chunk(reasoning_content="think").replace(b"\n", b"\r\n"), _chunk(reasoning="more"), DONE]
    res, firsts, _ = await _run(reads)
    assert firsts == [1.0] and res.chunks == 2


async def test_error_chunk_fails_the_turn():
    reads = [_chunk(content="a"), b'data: {"error":{"message":"boom inside","type":"InternalServerError","code":500}}\n\n', DONE]
    with pytest.raises(StreamError, match="boom inside"):
        await _run(reads)


async def test_http_error_status_is_one_line():
    with pytest.raises(StreamError, match=r"HTTP 400: too long"):
        await _run([b'{"error":{"message":"too long","type":"BadRequestError","code":400}}'], status=400)


async def test_stream_without_done_is_a_dropped_connection():
    with pytest.raises(StreamError, match="mid-stream"):
        await _run([_chunk(content="a")])


async def test_usage_chunk_never_resets_first_token():
    reads = [_chunk(content="a"), USAGE, _chunk(content="b"), DONE]
    res, firsts, _ = await _run(reads)
    assert firsts == [1.0] and res.first_t == 1.0


def test_body_encoding_round_trips():
    msgs = [encode_message("user", ["hé \"quoted\"\n", "ünïcode ", "\\slash"]), encode_message("assistant", ["ok"])]
    body = msgspec.json.decode(chat_body("m", msgs, 64, ignore_eos=True))
    assert body["messages"][0]["content"] == "hé \"quoted\"\nünïcode \\slash"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == 64 and body["max_tokens"] == 64


def test_error_text():
    assert error_text(b'{"error":{"message":"bad  model"}}', 404) == "HTTP 404: bad model"
    assert error_text(b"plain failure", 500) == "HTTP 500: plain failure"
