"""The server's own token counts, through its /tokenize.

vLLM and SGLang take {"prompt"} or {"messages"} (the chat template applied);
llama.cpp takes {"content"}, and applies a chat template only through
/apply-template. vLLM refuses a form it does not know; llama.cpp answers it
with no tokens, which for a non-empty text means "not this form".

A session counts its turns over its own streaming connection (wire.py): an
httpx request costs the driver's loop a dozen steps, and 64 sessions crossing
turn boundaries together held it past the client-busy bar. The probe and the
calibration, once per run, use httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import msgspec

from rampwatch.drivers.net.pass_share import take_turn
from rampwatch.drivers.net.wire import Connection, ConnectionDropped, ConnectionFailed

TEXT_FIELDS = ("prompt", "content")
TIMEOUT_S = 30.0

# POST a JSON body to a path under the server's base URL: (status, the decoded JSON answer).
PostJson = Callable[[str, dict[str, object]], Awaitable[tuple[int, object]]]
FAILED = (httpx.HTTPError, ConnectionFailed, ConnectionDropped, asyncio.TimeoutError, ValueError, AttributeError)


def over_httpx(client: httpx.AsyncClient, base_url: str, headers: dict[str, str]) -> PostJson:
    base = base_url.rstrip("/")

    async def post(path: str, payload: dict[str, object]) -> tuple[int, object]:
        r = await client.post(base + path, json=payload, headers=headers, timeout=TIMEOUT_S)
        return r.status_code, r.json() if r.status_code == 200 else None

    return post


def over_connection(conn: Connection, base_path: str, headers: dict[str, str]) -> PostJson:
    """Over a session's own keep-alive connection (never while it streams: a session does one thing at a time)."""
    base = base_path.rstrip("/")
    sent = {"Content-Type": "application/json", **headers}

    async def post(path: str, payload: dict[str, object]) -> tuple[int, object]:
        body: list[bytes] = []
        await take_turn()  # 256 sessions counting at once (their connections opening): they take turns
        parser = await conn.post(
            base + path, msgspec.json.encode(payload), sent, lambda s, d, t: body.append(d), TIMEOUT_S
        )
        await take_turn()  # answers to many sessions come together: each is read on in a pass with room
        status = parser.status or 0
        return status, msgspec.json.decode(b"".join(body)) if status == 200 else None

    return post


def tokenize_count(answer: object) -> int:
    """Tokens in a /tokenize answer: vLLM and SGLang give `count`, llama.cpp the `tokens` list."""
    if not isinstance(answer, dict):
        raise ValueError("not a /tokenize answer")
    n = answer.get("count")
    return int(n) if n is not None else len(answer.get("tokens") or [])


class ServerTokenizer:
    """Counts by the server's /tokenize. `field` is the text field it takes (found by the first
    count when None); `special_tokens` what it adds to any text (a BOS), not part of a text's own count."""

    def __init__(self, post: PostJson, model: str, field: str | None = None, special_tokens: int = 0):
        self.post, self.model = post, model
        self.field, self.special_tokens = field, special_tokens

    async def raw(self, text: str) -> int | None:
        """`text` as /tokenize counts it (a BOS included); None where no form of /tokenize answers."""
        for field in (self.field,) if self.field else TEXT_FIELDS:
            n = await self._ask({field: text})
            if n is not None and (n or not text):
                self.field = field
                return n
        return None

    async def text(self, text: str) -> int | None:
        """`text`'s own tokens; None where the server has no /tokenize or it failed."""
        n = await self.raw(text)
        return max(0, n - self.special_tokens) if n else None

    async def prompt(self, content: str, system: str | None = None) -> int | None:
        """The prompt of a conversation of one user message, `content` (after a system message, `system`,
        when given), as the server counts it (what its usage will report): /tokenize with messages, else
        (llama.cpp) /apply-template's prompt counted."""
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": content})
        n = await self._ask({"messages": messages})
        if n:
            return n
        try:
            status, answer = await self.post("/apply-template", {"messages": messages})
            templated = answer.get("prompt") if status == 200 else None  # type: ignore[union-attr]
        except FAILED:
            templated = None
        return await self.raw(templated) if isinstance(templated, str) else None

    async def prompt_ids(self, content: str) -> list[int] | None:
        """The token ids of a one-message conversation's prompt, where the server's /tokenize gives them (vLLM,
        SGLang, the simulated engine; llama.cpp through /apply-template); None where it gives only a count."""
        form: dict[str, object] = {"messages": [{"role": "user", "content": content}]}
        try:
            status, answer = await self.post("/tokenize", {"model": self.model, **form})
            if status != 200:
                status, templated = await self.post("/apply-template", form)
                prompt = templated.get("prompt") if status == 200 else None  # type: ignore[union-attr]
                if not isinstance(prompt, str):
                    return None
                status, answer = await self.post("/tokenize", {"model": self.model, "content": prompt})
            ids = answer.get("tokens") if status == 200 else None  # type: ignore[union-attr]
        except (*FAILED, TypeError):
            return None
        return [int(i) for i in ids] if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids) else None

    async def _ask(self, form: dict[str, object]) -> int | None:
        try:
            status, answer = await self.post("/tokenize", {"model": self.model, **form})
            return tokenize_count(answer) if status == 200 else None
        except (*FAILED, TypeError):
            return None
