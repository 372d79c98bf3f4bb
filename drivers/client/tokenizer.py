"""The server's own token counts, through its /tokenize.

vLLM and SGLang take {"prompt"} or {"messages"} (the chat template applied);
llama.cpp takes {"content"}, and applies a chat template only through
/apply-template. vLLM refuses a form it does not know; llama.cpp answers it
with no tokens, which for a non-empty text means "not this form".
"""

from __future__ import annotations

import httpx

TEXT_FIELDS = ("prompt", "content")


def tokenize_count(answer: object) -> int:
    """Tokens in a /tokenize answer: vLLM and SGLang give `count`, llama.cpp the `tokens` list."""
    if not isinstance(answer, dict):
        raise ValueError("not a /tokenize answer")
    n = answer.get("count")
    return int(n) if n is not None else len(answer.get("tokens") or [])


class ServerTokenizer:
    """Counts by the server's /tokenize. `field` is the text field it takes (found by the first
    count when None); `special_tokens` what it adds to any text (a BOS), not part of a text's own count."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        model: str,
        headers: dict[str, str],
        field: str | None = None,
        special_tokens: int = 0,
    ):
        self.client, self.base_url, self.model, self.headers = client, base_url.rstrip("/"), model, headers
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
            r = await self.client.post(
                self.base_url + "/apply-template", json={"messages": messages}, headers=self.headers, timeout=30.0
            )
            templated = r.json().get("prompt") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            templated = None
        return await self.raw(templated) if isinstance(templated, str) else None

    async def _ask(self, form: dict[str, object]) -> int | None:
        try:
            r = await self.client.post(
                self.base_url + "/tokenize", json={"model": self.model, **form}, headers=self.headers, timeout=30.0
            )
            return tokenize_count(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return None
