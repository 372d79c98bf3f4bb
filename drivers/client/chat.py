"""Streaming chat completions: request bodies, the SSE parser, and one streamed turn.

Each network read is stamped before any parsing, and a chunk counts as a
token only when it carries generated text (content, reasoning or a tool
call); the role prelude, keep-alive comments and the usage chunk do not.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec

from rampwatch.drivers.model.events import PiledUp
from rampwatch.drivers.net.wire import Connection, piled_up


class Delta(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: Any = None


class Choice(msgspec.Struct):
    delta: Delta | None = None
    text: str | None = None  # /v1/completions
    finish_reason: str | None = None


class PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None
    completion_tokens_details: CompletionDetails | None = None


class Timings(msgspec.Struct):
    """llama.cpp's own figures for the request, on its last chunk."""

    prompt_ms: float | None = None  # prompt processing (cached tokens excluded)
    cache_n: int | None = None  # prompt tokens reused from its cache


class SpecDecoding(msgspec.Struct):
    """vLLM's metrics.speculative_decoding (needs --per-request-spec-decode-metrics summary)."""

    num_accepted_draft_tokens: int | None = None
    num_draft_tokens: int | None = None
    num_spec_steps: int | None = None


class EngineMetrics(msgspec.Struct):
    """vLLM's per-request metrics (--enable-per-request-metrics), beside usage on the last chunk; in ms."""

    queue_time_ms: float | None = None  # queued to scheduled
    time_to_first_token_ms: float | None = None  # scheduled to first token: the engine's prefill
    generation_time_ms: float | None = None  # first to last token
    mean_itl_ms: float | None = None
    speculative_decoding: SpecDecoding | None = None


class Chunk(msgspec.Struct):
    choices: list[Choice] = []
    usage: Usage | None = None
    error: Any = None
    timings: Timings | None = None
    metrics: EngineMetrics | None = None


_decode_chunk = msgspec.json.Decoder(Chunk).decode
_phases = random.Random()  # where each stream's token batches end (no figure depends on it)
_encode = msgspec.json.encode


class StreamError(Exception):
    """The server refused the request or failed it mid-stream."""


class StreamResult(msgspec.Struct):
    first_t: float | None = None
    last_t: float | None = None
    chunks: int = 0
    text: str = ""  # the reply's content (the answer); never the reasoning
    answer_pieces: list[str] = []  # the answer's text chunk by chunk (text joins them)
    reasoning: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens
    reasoning_chunks: int = 0  # chunks that carried reasoning and no answer
    answer_t: float | None = None  # the first chunk of the answer (content or a tool call)
    finish_reason: str | None = None
    # The engine's prefill: vLLM's metrics.time_to_first_token_ms, else llama.cpp's timings.prompt_ms.
    engine_prefill_s: float | None = None
    server_cached: int | None = None  # the server's own cached prompt tokens (llama.cpp's timings.cache_n)
    queued_s: float | None = None  # vLLM's metrics.queue_time_ms
    engine_decode_s: float | None = None  # vLLM's metrics.generation_time_ms
    spec: SpecDecoding | None = None  # vLLM's metrics.speculative_decoding
    prefill_leg_s: float | None = None  # a prefill/decode split's front: its prefill server's time (x-prefill-leg-ms)


def encode_message(role: str, pieces: list[str]) -> bytes:
    """A chat message as JSON bytes, encoded piece by piece so a multi-MB
    message never holds the event loop for long; history stays pre-encoded."""
    parts = [_encode(p)[1:-1] for p in pieces]
    return b'{"role":' + _encode(role) + b',"content":"' + b"".join(parts) + b'"}'


def _stream_options(model: str, max_tokens: int, ignore_eos: bool, extra: dict[str, Any] | None) -> dict[str, Any]:
    """What every streamed request asks besides its prompt: usage in the last chunk, greedy decoding, and with
    --ignore-eos exactly max_tokens (min_tokens says so too)."""
    opts: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if ignore_eos:
        opts["ignore_eos"] = True
        opts["min_tokens"] = max_tokens
    if extra:
        opts.update(extra)
    return opts


def chat_body(
    model: str, messages: list[bytes], max_tokens: int, ignore_eos: bool, extra: dict[str, Any] | None = None
) -> list[bytes]:
    """The request body in parts, the messages' own bytes among them: a 1M-token history is sent
    from the session's messages as they are, never joined into one more copy. `extra` (--extra-body)
    adds request options; the keys rampwatch sets itself were refused before the run started."""
    opts = _stream_options(model, max_tokens, ignore_eos, extra)
    parts = [_encode(opts)[:-1] + b',"messages":[']
    for k, message in enumerate(messages):
        parts += [b",", message] if k else [message]
    return [*parts, b"]}"]


def completion_body(
    model: str, pieces: list[str], max_tokens: int, ignore_eos: bool, extra: dict[str, Any] | None = None
) -> list[bytes]:
    """A /v1/completions request body: the prompt exactly as given, no chat template (a trace's token-exact
    prompt), its pieces encoded one by one as encode_message does."""
    opts = _stream_options(model, max_tokens, ignore_eos, extra)
    return [_encode(opts)[:-1] + b',"prompt":"', *(_encode(p)[1:-1] for p in pieces), b'"}']


def error_text(body: bytes | str, status: int | None = None) -> str:
    """One line from an OpenAI-style error body (or the raw text)."""
    raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    message = raw.strip()
    try:
        err = msgspec.json.decode(raw)
        if isinstance(err, dict):
            err = err.get("error", err)
        if isinstance(err, dict):
            message = str(err.get("message") or err)
        elif err:
            message = str(err)
    except msgspec.DecodeError:
        pass
    message = " ".join(message.split())[:300]
    return f"HTTP {status}: {message}" if status is not None else message


class ChatStreamParser:
    """Server-sent events of a chat completion, fed as body bytes arrive.

    `on_first(t)` fires at the first text chunk; `on_times(times, counts, piled_up)`
    gets the arrival times of text chunks every `flush_every` seconds and at the end:
    each read's stamp and how many chunks it carried (`counts` empty: one each), and
    whether a read of them held several tokens that may have come over 5 ms apart
    (None: none did; "own": the driver's own work held them; "machine": the machine).
    A reply that reasons first: `on_reasoning(t)`, where given, fires at its
    first chunk instead of `on_first`, and `on_answer(t)` at the first chunk
    of its answer (content or a tool call)."""

    def __init__(
        self,
        on_first: Callable[[float], None],
        on_times: Callable[[list[float], list[int], PiledUp | None], None],
        flush_every: float = 0.25,
        on_reasoning: Callable[[float], None] | None = None,
        on_answer: Callable[[float], None] | None = None,
    ):
        self.on_first, self.on_times, self.flush_every = on_first, on_times, flush_every
        self.on_reasoning, self.on_answer = on_reasoning, on_answer
        self.res = StreamResult()
        self.done = False  # saw data: [DONE]
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._batch: list[float] = []  # each read's stamp ...
        self._counts: list[int] = []  # ... and the text chunks it carried
        self._piled_up: PiledUp | None = None  # the batch's: see on_times
        self._next_flush = 0.0
        self._buf = b""

    def feed(self, data: bytes, t: float) -> None:
        buf = self._buf + data if self._buf else data
        if b"\n\n" not in buf and b"\r\n\r\n" not in buf:
            self._buf = buf
            return
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, self._buf = buf.split(b"\n\n")
        res = self.res
        before = res.chunks
        for ev in events:
            for line in ev.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # comments (keep-alives, pings) and other fields
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    break
                chunk = _decode_chunk(payload)
                if chunk.error is not None:
                    raise StreamError(error_text(_encode(chunk.error)))
                for choice in chunk.choices:
                    if choice.finish_reason:
                        res.finish_reason = choice.finish_reason
                    d = choice.delta
                    piece = choice.text if d is None else d.content
                    thought = None if d is None else (d.reasoning or d.reasoning_content)
                    answer = bool(piece or (d is not None and d.tool_calls))
                    if answer or thought:
                        if res.first_t is None:
                            res.first_t = t
                            (self.on_reasoning if not answer and self.on_reasoning else self.on_first)(t)
                            # Each stream's batches end at a phase of their own: sessions whose tokens come in
                            # the same engine step would otherwise all flush in one pass of the loop.
                            self._next_flush = t + self.flush_every * (0.5 + _phases.random())
                        if answer and res.answer_t is None:
                            res.answer_t = t
                            if res.reasoning_chunks and self.on_answer is not None:
                                self.on_answer(t)
                        if not answer:
                            res.reasoning_chunks += 1
                        res.last_t = t
                        res.chunks += 1
                        if piece:
                            self._text.append(piece)
                        if thought:
                            self._reasoning.append(thought)
                        break
                tm = chunk.timings
                if tm is not None:
                    if tm.prompt_ms is not None:
                        res.engine_prefill_s = tm.prompt_ms / 1000
                    res.server_cached = tm.cache_n
                if chunk.metrics is not None:
                    _engine_metrics(res, chunk.metrics)
                u = chunk.usage
                if u is not None:
                    res.prompt_tokens = u.prompt_tokens
                    res.completion_tokens = u.completion_tokens
                    if u.completion_tokens_details is not None:
                        res.reasoning_tokens = u.completion_tokens_details.reasoning_tokens
                    if u.prompt_tokens_details is not None:
                        res.cached_tokens = u.prompt_tokens_details.cached_tokens
        read = res.chunks - before
        if read:
            self._batch.append(t)
            self._counts.append(read)
        if read > 1:  # one stamp for several tokens: exact only if the loop read them promptly
            held = piled_up()
            if held is not None:  # the driver's own hold outranks the machine's in the batch's one word
                self._piled_up = "own" if held or self._piled_up == "own" else "machine"
        if self._batch and (t >= self._next_flush or self.done):
            self._flush()
            self._next_flush = t + self.flush_every

    def _flush(self) -> None:
        several = max(self._counts) > 1  # else every read carried one: the stamps alone say it
        self.on_times(self._batch, self._counts if several else [], self._piled_up)
        self._batch, self._counts, self._piled_up = [], [], None

    def finish(self) -> StreamResult:
        """The result once the response has ended; raises if it ended early."""
        if self._batch:
            self._flush()
        if not self.done:
            raise StreamError(
                "stream ended before any token" if self.res.first_t is None else "connection closed mid-stream"
            )
        self.res.answer_pieces = self._text
        self.res.text = "".join(self._text)
        self.res.reasoning = "".join(self._reasoning)
        return self.res


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000


def _engine_metrics(res: StreamResult, m: EngineMetrics) -> None:
    """vLLM's per-request metrics into the result, in seconds."""
    res.queued_s = _ms(m.queue_time_ms)
    if m.time_to_first_token_ms is not None:
        res.engine_prefill_s = m.time_to_first_token_ms / 1000
    res.engine_decode_s = _ms(m.generation_time_ms)
    res.spec = m.speculative_decoding


async def stream_chat(
    conn: Connection,
    path: str,
    body: bytes | list[bytes],
    headers: dict[str, str],
    on_first: Callable[[float], None],
    on_times: Callable[[list[float], list[int], PiledUp | None], None],
    timeout: float | None = None,
    on_reasoning: Callable[[float], None] | None = None,
    on_answer: Callable[[float], None] | None = None,
) -> StreamResult:
    """POST a streaming chat request on `conn` and read it to the end (callbacks: ChatStreamParser's)."""
    parser = ChatStreamParser(on_first, on_times, on_reasoning=on_reasoning, on_answer=on_answer)
    error_body: list[bytes] = []

    def on_body(status: int, data: bytes, t: float) -> None:
        if status == 200:
            parser.feed(data, t)
        else:
            error_body.append(data)

    response = await conn.post(path, body, {"Content-Type": "application/json", **headers}, on_body, timeout)
    if response.status != 200:
        raise StreamError(error_text(b"".join(error_body), response.status))
    res = parser.finish()
    res.prefill_leg_s = prefill_leg_s(response.headers.get("x-prefill-leg-ms"))
    return res


def prefill_leg_s(header: str | None) -> float | None:
    """A split's front's x-prefill-leg-ms header in seconds (rampwatch's proxy sends it); None where absent or bad."""
    try:
        ms = float(header) if header is not None else None
    except ValueError:
        return None
    return ms / 1000 if ms is not None and 0 <= ms < 1e9 else None
