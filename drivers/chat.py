"""Streaming OpenAI-compatible chat client: one request, timestamps at the socket.

Each network read is stamped before any parsing, and a chunk counts as a
token only when it carries generated text (content, reasoning or a tool
call); the role prelude, keep-alive comments and the usage chunk do not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec


class Delta(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: Any = None


class Choice(msgspec.Struct):
    delta: Delta | None = None
    text: str | None = None  # /v1/completions


class PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None


class Chunk(msgspec.Struct):
    choices: list[Choice] = []
    usage: Usage | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(Chunk).decode
_encode = msgspec.json.encode


class StreamError(Exception):
    """The server refused the request or failed it mid-stream."""


class StreamResult(msgspec.Struct):
    first_t: float | None = None
    last_t: float | None = None
    chunks: int = 0
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None


def encode_message(role: str, pieces: list[str]) -> bytes:
    """A chat message as JSON bytes, encoded piece by piece so a multi-MB
    message never holds the event loop for long; history stays pre-encoded."""
    parts = [_encode(p)[1:-1] for p in pieces]
    return b'{"role":' + _encode(role) + b',"content":"' + b"".join(parts) + b'"}'


def chat_body(model: str, messages: list[bytes], max_tokens: int, ignore_eos: bool) -> bytes:
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
    head = _encode(opts)
    return head[:-1] + b',"messages":[' + b",".join(messages) + b"]}"


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


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    clock: Callable[[], float],
    on_first: Callable[[float], None],
    on_times: Callable[[list[float]], None],
    flush_every: float = 0.25,
) -> StreamResult:
    """POST a streaming chat request and read it to the end.

    `on_first(t)` fires at the first text chunk; `on_times(batch)` gets the
    arrival times of text chunks every `flush_every` seconds and at the end.
    """
    res = StreamResult()
    text_parts: list[str] = []
    batch: list[float] = []
    next_flush = 0.0
    buf = b""
    done = False
    async with client.stream("POST", url, content=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise StreamError(error_text(await resp.aread(), resp.status_code))
        async for raw in resp.aiter_raw():
            t = clock()  # stamped on arrival, before parsing
            buf += raw
            if b"\n\n" not in buf and b"\r\n\r\n" not in buf:
                continue
            if b"\r" in buf:
                buf = buf.replace(b"\r\n", b"\n")
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue  # comments (keep-alives, pings) and other fields
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    chunk = _decode_chunk(payload)
                    if chunk.error is not None:
                        raise StreamError(error_text(_encode(chunk.error)))
                    for choice in chunk.choices:
                        d = choice.delta
                        piece = choice.text if d is None else (d.content or d.reasoning or d.reasoning_content)
                        if piece or (d is not None and d.tool_calls):
                            if res.first_t is None:
                                res.first_t = t
                                on_first(t)
                                next_flush = t + flush_every
                            res.last_t = t
                            res.chunks += 1
                            batch.append(t)
                            if piece:
                                text_parts.append(piece)
                            break
                    u = chunk.usage
                    if u is not None:
                        res.prompt_tokens = u.prompt_tokens
                        res.completion_tokens = u.completion_tokens
                        if u.prompt_tokens_details is not None:
                            res.cached_tokens = u.prompt_tokens_details.cached_tokens
            if batch and t >= next_flush:
                on_times(batch)
                batch = []
                next_flush = t + flush_every
            if done:
                break
    if batch:
        on_times(batch)
    if not done and res.first_t is None:
        raise StreamError("stream ended before any token")
    if not done:
        raise StreamError("connection closed mid-stream")
    res.text = "".join(text_parts)
    return res


def monotonic_clock() -> Callable[[], float]:
    """Seconds since now, on the high-resolution monotonic clock."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0
