"""SSE parsing and timestamps of the streaming client, on hand-made streams."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time

import msgspec
import pytest

from rampwatch.drivers.client.chat import (
    ChatStreamParser,
    StreamError,
    chat_body,
    encode_message,
    error_text,
    stream_chat,
)
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.net.http_response import WRITE_SLICE
from rampwatch.drivers.net.stamped_socket import SO_TIMESTAMPNS, StampedSocket
from rampwatch.drivers.net.wire import (
    Connection,
    ConnectionDropped,
    ConnectionFailed,
    ResponseParser,
    within,
)

# Each kind of connection: its clock, and whether it speaks TLS.
_KINDS = {"kernel-stamped": (RunClock, False), "kernel-stamped TLS": (RunClock, True), "transport": (None, False)}
_kind: dict = {"name": "kernel-stamped", "cert": None}


@pytest.fixture(autouse=True, params=list(_KINDS))
def _connection_kind(request):
    """Every test over a socket runs on each kind of connection: on the run's clock, plain HTTP and TLS read the
    kernel's receive times (stamped_socket.py); on any other clock it goes through asyncio's transport."""
    _kind["name"] = request.param
    _kind["cert"] = request.getfixturevalue("self_signed") if _KINDS[request.param][1] else None
    yield


def _kernel_stamped() -> bool:
    return _KINDS[_kind["name"]][0] is RunClock


def _connection(url: str) -> Connection:
    """A client of `url` (a _server's) of the kind the test runs on: TLS trusts the test's own certificate."""
    clock, tls = _KINDS[_kind["name"]]
    ctx = ssl.create_default_context(cafile=_kind["cert"][0]) if tls else None
    return Connection(url, clock() if clock is not None else lambda: 0.0, tls=ctx)


def _chunk(**delta) -> bytes:
    return (
        b"data: "
        + msgspec.json.encode({"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        + b"\n\n"
    )


USAGE = (
    b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":18,"total_tokens":34,"completion_tokens":16,'
    b'"prompt_tokens_details":{"cached_tokens":16}}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def _run_sync(reads: list[bytes]):
    """Feed each 'network read' to the parser at t = 1, 2, 3, ..."""
    firsts: list[float] = []
    batches: list[tuple[list[float], list[int]]] = []  # each batch's stamps and the chunks each stamp stands for
    p = ChatStreamParser(firsts.append, lambda b, counts, piled: batches.append((b, counts)), flush_every=100.0)
    for i, r in enumerate(reads):
        p.feed(r, float(i + 1))
    return p.finish(), firsts, batches


async def _run(reads: list[bytes], status: int = 200):
    if status != 200:
        body = b"".join(reads)
        return await _one_response(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
    return _run_sync(reads)


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
    assert batches == [([3.0, 4.0], [1, 2])]  # one stamp a read, with the chunks it carried
    assert ev.chunk_times(*batches[0]) == [3.0, 4.0, 4.0]
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
    reads = [
        _chunk(content="a"),
        b'data: {"error":{"message":"boom inside","type":"InternalServerError","code":500}}\n\n',
        DONE,
    ]
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
    msgs = [encode_message("user", ['hé "quoted"\n', "ünïcode ", "\\slash"]), encode_message("assistant", ["ok"])]
    body = msgspec.json.decode(b"".join(chat_body("m", msgs, 64, ignore_eos=True)))
    assert body["messages"][0]["content"] == 'hé "quoted"\nünïcode \\slash'
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == 64 and body["max_tokens"] == 64


def test_error_text():
    assert error_text(b'{"error":{"message":"bad  model"}}', 404) == "HTTP 404: bad model"
    assert error_text(b"plain failure", 500) == "HTTP 500: plain failure"


# -- the wire: a real socket, chunked transfer encoding, keep-alive ---------------------------


def _chunked(pieces: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]


async def _server(handler):
    """A server on a free port, over TLS where the test runs on TLS connections, and its URL."""
    ctx = None
    if _kind["cert"] is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*_kind["cert"])
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ctx)
    return server, f"{'https' if ctx else 'http'}://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
    return head + await reader.readexactly(length)


async def test_stream_over_a_socket_with_chunks_split_anywhere():
    events = [_chunk(role="assistant", content=""), _chunk(content="Hel"), _chunk(content="lo"), USAGE, DONE]
    wire = b"".join(_chunked(events))
    requests = []

    async def handle(reader, writer):
        for _ in range(2):  # two requests on one keep-alive connection
            requests.append(await _read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(0, len(wire), 7):  # 7-byte writes split chunk headers, CRLFs and events
                writer.write(wire[i : i + 7])
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    server, url = await _server(handle)
    async with server:
        conn = _connection(url)
        for _ in range(2):
            res = await stream_chat(
                conn,
                "/v1/chat/completions",
                b'{"x":1}',
                {"Authorization": "Bearer k"},
                lambda t: None,
                lambda b, c, p: None,
                timeout=10,
            )
            assert res.text == "Hello" and res.chunks == 2 and res.prompt_tokens == 18
        # the kind of connection asked for, not a silent fallback
        assert isinstance(conn._proto, StampedSocket) == _kernel_stamped()
        assert (getattr(conn._proto, "tls", None) is not None) == _KINDS[_kind["name"]][1]
        conn.close()
    assert len(requests) == 2 and b"Authorization: Bearer k" in requests[0] and requests[0].endswith(b'{"x":1}')


HELLO = [_chunk(role="assistant", content=""), _chunk(content="Hel"), _chunk(content="lo"), USAGE, DONE]


async def _one_response(raw: bytes) -> object:
    """Serve `raw` as the whole response to one request (the server may close after it)."""

    async def handle(reader, writer):
        await _read_request(reader)
        writer.write(raw)
        await writer.drain()
        writer.close()

    server, url = await _server(handle)
    async with server:
        conn = _connection(url)
        try:
            return await stream_chat(
                conn, "/v1/chat/completions", b"{}", {}, lambda t: None, lambda b, c, p: None, timeout=10
            )
        finally:
            conn.close()


async def test_http10_body_delimited_by_the_close():
    """HTTP/1.0 servers and some proxies send neither Content-Length nor chunks: the close ends the body."""
    res = await _one_response(b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + b"".join(HELLO))
    assert res.text == "Hello" and res.chunks == 2


async def test_interim_1xx_responses_are_skipped():
    body = b"".join(_chunked(HELLO))
    res = await _one_response(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body
    )
    assert res.text == "Hello"


async def test_content_length_body():
    body = b"".join(HELLO)
    res = await _one_response(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    assert res.text == "Hello"


def test_ipv6_literal_host_header():
    assert Connection("http://[::1]:8000", lambda: 0.0).host_header == "[::1]:8000"
    assert Connection("http://[fe80::1]/v1", lambda: 0.0).host_header == "[fe80::1]"
    conn = Connection("https://[2001:db8::5]", lambda: 0.0)
    assert (conn.host, conn.port, conn.host_header) == ("2001:db8::5", 443, "[2001:db8::5]")
    assert Connection("http://example.com:81", lambda: 0.0).host_header == "example.com:81"


async def test_a_keepalive_connection_the_server_dropped_is_retried_on_a_fresh_one():
    """The race every keep-alive client meets: the server drops the idle connection just as the
    next request goes out on it. The request is sent again, once, on a new connection."""
    connections = []

    async def handle(reader, writer):
        connections.append(writer)
        await _read_request(reader)
        body = b"".join(_chunked([_chunk(content="a"), DONE]))
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body)
        await writer.drain()
        if len(connections) == 1:
            await _read_request(reader)  # the reused connection's request: drop it unanswered
            writer.close()

    server, url = await _server(handle)
    async with server:
        conn = _connection(url)
        assert (await stream_chat(conn, "/p", b"{}", {}, lambda t: None, lambda b, c, p: None, timeout=10)).text == "a"
        assert (await stream_chat(conn, "/p", b"{}", {}, lambda t: None, lambda b, c, p: None, timeout=10)).text == "a"
        conn.close()
    assert len(connections) == 2  # the second request went out twice: on the old connection, then a new one


async def test_stale_keepalive_connection_is_retried_once_and_drops_are_reported():
    served = []

    async def handle(reader, writer):
        req = await _read_request(reader)
        served.append(req)
        if len(served) == 1:  # answer, then close the idle connection as servers do
            body = b"".join(_chunked([_chunk(content="a"), DONE]))
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body)
            await writer.drain()
            writer.close()
            return
        if len(served) == 2:
            body = b"".join(_chunked([_chunk(content="b"), DONE]))
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body)
            await writer.drain()
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked([_chunk(content="c")])[0])
        await writer.drain()
        writer.close()  # mid-stream

    server, url = await _server(handle)
    async with server:
        conn = _connection(url)
        assert (await stream_chat(conn, "/p", b"{}", {}, lambda t: None, lambda b, c, p: None)).text == "a"
        await asyncio.sleep(0.05)
        assert (await stream_chat(conn, "/p", b"{}", {}, lambda t: None, lambda b, c, p: None)).text == "b"
        with pytest.raises(ConnectionDropped):
            await stream_chat(conn, "/p", b"{}", {}, lambda t: None, lambda b, c, p: None)
        conn.close()


async def test_a_large_body_goes_out_in_parts_without_a_buffered_copy():
    """A 16 MB history sent to a server that reads slowly: every byte arrives in order, and what the
    transport holds at any moment stays near one slice, not the rest of the body."""
    # Large parts (a history's messages) between small ones (the separators), as chat_body gives them.
    parts = (
        [b'{"messages":['] + [p for k in range(8) for p in (bytes([65 + k]) * (2 * 1024 * 1024 + k), b",")] + [b"]}"]
    )
    got = bytearray()

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(got) < length:
            got.extend(await reader.read(65536))
            await asyncio.sleep(0.0005)
        body = b"".join(_chunked([_chunk(content="a"), DONE]))
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body)
        await writer.drain()

    server, url = await _server(handle)
    async with server:
        conn = _connection(url)
        buffered = [0]

        async def watch() -> None:
            while True:
                proto = conn._proto
                if proto is not None and getattr(proto, "transport", None) is not None:
                    buffered[0] = max(buffered[0], proto.transport.get_write_buffer_size())
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        res = await stream_chat(conn, "/p", parts, {}, lambda t: None, lambda b, c, p: None, timeout=30)
        watcher.cancel()
        conn.close()
    assert res.text == "a" and bytes(got) == b"".join(parts)
    if not _kernel_stamped():  # the kernel-stamped socket writes each slice itself: nothing held
        assert 0 < buffered[0] <= 2 * WRITE_SLICE, buffered[0]


async def test_an_answer_before_the_body_went_out_ends_the_request_and_the_connection():
    """A server that refuses a request from its head (413) and stops reading: the error comes back at
    once, and the connection, with part of the body unsent, is not used again."""

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        error = b'{"error": {"message": "too large"}}'
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error))
        await writer.drain()
        await asyncio.sleep(30)  # neither reads the rest nor closes

    server, url = await _server(handle)
    async with server:
        conn = _connection(url)
        with pytest.raises(StreamError, match="too large"):
            await stream_chat(
                conn, "/p", [b"x" * (64 * 1024 * 1024)], {}, lambda t: None, lambda b, c, p: None, timeout=20
            )
        assert conn._proto is None
        server.close()


async def test_nothing_listening_is_connection_failed():
    server, url = await _server(lambda r, w: None)
    server.close()
    await server.wait_closed()
    with pytest.raises(ConnectionFailed):
        await _connection(url).post("/p", b"", {}, lambda s, d, t: None)


async def test_a_get_sends_no_body_and_returns_the_whole_answer_over_one_kept_connection():
    """A /metrics scrape: a GET head with no Content-Length, the body whole, the next GET on the same
    connection; an answer that is not HTTP is a ValueError, not a crash."""
    heads: list[bytes] = []
    connections = [0]

    async def handle(reader, writer):
        connections[0] += 1
        while True:
            try:
                heads.append(await reader.readuntil(b"\r\n\r\n"))
            except asyncio.IncompleteReadError:
                return
            body = b"vllm:num_requests_running 2\n" * 1000
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    server, url = await _server(handle)
    async with server:
        conn = _connection(url)
        for _ in range(2):
            status, body = await conn.get("/metrics?x=1", {"Authorization": "Bearer t"}, timeout=10)
            assert status == 200 and body == b"vllm:num_requests_running 2\n" * 1000
        conn.close()
    assert connections[0] == 1 and len(heads) == 2
    assert heads[0].startswith(b"GET /metrics?x=1 HTTP/1.1\r\n") and b"content-length" not in heads[0].lower()
    assert b"\r\nAuthorization: Bearer t\r\n" in heads[0]

    async def not_http(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()

    server, url = await _server(not_http)
    async with server:
        with pytest.raises(ValueError, match="not an HTTP response"):
            await _connection(url).get("/metrics", {}, timeout=10)


def test_response_parser_content_length_and_chunked_byte_by_byte():
    got = []
    p = ResponseParser(lambda status, data, t: got.append((status, data)))
    for b in (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nab", b"cde"):
        p.feed(b, 0.0)
    assert p.done and p.status == 400 and b"".join(d for _, d in got) == b"abcde"
    got.clear()
    p = ResponseParser(lambda status, data, t: got.append(data))
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + b"".join(
        _chunked([b"hello", b" world"])
    )
    for i in range(len(wire)):
        p.feed(wire[i : i + 1], 0.0)
    assert p.done and b"".join(got) == b"hello world" and not p.keep_alive


async def test_a_stop_that_comes_as_the_answer_does_is_not_swallowed():
    """A task cancelled in the pass whose answer completes the request it awaits ends cancelled (asyncio's
    wait_for returned the answer then, before Python 3.12, and a stopped scraper scraped on for ever); past
    its limit the wait is a TimeoutError, and an answer in time is returned."""
    loop = asyncio.get_running_loop()
    answer = loop.create_future()
    task = asyncio.create_task(within(answer, 10))
    await asyncio.sleep(0)  # the task now waits
    answer.set_result("ok")
    task.cancel()  # the same pass
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(asyncio.TimeoutError):
        await within(loop.create_future(), 0.01)
    late = loop.create_future()
    loop.call_later(0.01, late.set_result, "ok")
    assert await within(late, 10) == "ok" and await within(asyncio.sleep(0, "x"), None) == "x"


async def test_a_kernel_stamp_never_goes_back_past_the_last_reads():
    """The kernel's time is converted to the run's clock by reading two clocks apart: a read whose conversion
    came out early (the realtime reading late) is stamped no earlier than the read before it, and after a read
    that emptied the socket, no earlier than that read's handling."""
    a, b = socket.socketpair()
    clock = RunClock()
    sock = StampedSocket(a, clock, clock)

    def kernel(seconds_ago: float) -> list[tuple[int, int, bytes]]:
        at = time.time() - seconds_ago
        return [(socket.SOL_SOCKET, SO_TIMESTAMPNS, struct.pack("qq", int(at), int(at % 1 * 1e9)))]

    try:
        full = len(sock._into)  # a read that filled the buffer: the socket may hold more
        first = sock._stamp(kernel(0.010), full)
        assert clock() - 0.012 < first < clock() - 0.008
        assert sock._stamp(kernel(0.500), full) == first  # its bytes came after the first read's
        before = clock()
        emptied = sock._stamp(kernel(0.0), 10)  # this read emptied the socket
        assert sock._stamp(kernel(0.500), 10) >= before  # what came next came after it was handled
        assert emptied <= clock()
    finally:
        sock.close()
        b.close()
