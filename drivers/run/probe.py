"""What the server is: its model, context limit and engine, and its tokenizer's
figures, learned before any ramp traffic so bad input fails fast."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from rampwatch.drivers.client.ramp import DEFAULT_TEMPLATE_TOKENS, Calibration, Conversation, Filler, tokenize_count
from rampwatch.drivers.client.tls import is_untrusted
from rampwatch.drivers.run.config import BadInput, RunConfig


@dataclass
class ServerInfo:
    model: str
    max_model_len: int | None
    engine: str | None
    engine_version: str | None


async def probe(client: httpx.AsyncClient, cfg: RunConfig, base: str | None = None) -> ServerInfo:
    """Who is serving at `base` (default: the first server), and which model:
    bad input is found before any traffic."""
    base = where = base or cfg.base_url  # credentials already stripped
    try:
        r = await client.get(base + "/v1/models", headers=cfg.headers(), timeout=10.0)
    except httpx.HTTPError as e:
        if is_untrusted(e):
            raise BadInput(f"{where}: its TLS certificate is not trusted (give its CA with --ca-bundle PATH, "
                           "or skip verification with --insecure)") from None
        raise BadInput(f"cannot reach {where}: {type(e).__name__} (is the server up?)") from None
    if r.status_code in (401, 403):
        raise BadInput(f"{where} refused the request (HTTP {r.status_code}): check --api-key-env / --api-key-file")
    try:
        data = r.json()["data"]
        models = [m["id"] for m in data]
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"{where} is not an OpenAI-compatible server (GET /v1/models gave HTTP {r.status_code})") from None
    if not models:
        raise BadInput(f"{where} serves no models")
    model = cfg.model or models[0]
    if model not in models:
        raise BadInput(f"model {model!r} is not served by {where} (it serves: {', '.join(models)})")
    entry = data[models.index(model)]
    meta = entry.get("meta") or {}  # llama.cpp puts its context size here
    max_len = entry.get("max_model_len") or meta.get("n_ctx") or meta.get("n_ctx_train")
    owned = str(entry.get("owned_by", ""))
    version = None
    try:
        v = await client.get(base + "/version", headers=cfg.headers(), timeout=5.0)
        if v.status_code == 200:
            version = v.json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    # None when /v1/models does not say: the report then names the engine its /metrics revealed.
    engine = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp"}.get(owned, owned or None)
    return ServerInfo(model=model, max_model_len=max_len, engine=engine, engine_version=version)


def check_schedule(cfg: RunConfig, info: ServerInfo) -> None:
    if info.max_model_len and cfg.schedule[-1] + cfg.output_tokens > info.max_model_len:
        raise BadInput(
            f"the ramp's last turn ({cfg.schedule[-1]:,} tokens + {cfg.output_tokens} output) exceeds the server's "
            f"max_model_len {info.max_model_len:,}; try --scale-to {_suggest(info.max_model_len - cfg.output_tokens)}"
        )


def _suggest(limit: int) -> str:
    k = int(limit * 0.95) // 1024
    return f"{k}k" if k else str(int(limit * 0.95))


async def calibrate(client: httpx.AsyncClient, cfg: RunConfig, model: str, probe_conv: Conversation) -> Calibration:
    """Measure the server's tokenizer once: filler chars per token, chat-template
    tokens around a message, and the needle's fixed text. Falls back to rough
    figures where /tokenize is missing (usage then corrects from turn 2)."""
    sample = Filler(random.Random(7)).text(20_000)

    field: list[str] = []  # the text field that worked

    async def count(body: dict[str, object]) -> int | None:
        # vLLM and SGLang take {"prompt"} or {"messages"}; llama.cpp takes {"content"} (and answers
        # an unknown form with no tokens, which for a non-empty text means "not this form").
        text = body.get("prompt", body.get("messages"))
        for form in (body, {"content": body.get("prompt")} if "prompt" in body else None):
            if form is None:
                continue
            try:
                r = await client.post(cfg.base_url + "/tokenize", json={"model": model, **form}, headers=cfg.headers(), timeout=30.0)
                if r.status_code == 200:
                    n = tokenize_count(r.json())
                    if n or not text:
                        if n and not field and "messages" not in form:
                            field.extend(form)
                        return n
            except (httpx.HTTPError, ValueError, AttributeError, TypeError):
                pass
        return None

    async def count_chat(content: str) -> int | None:
        """Tokens of one user message in the chat template: /tokenize with messages, else
        (llama.cpp) the template applied by /apply-template, then counted."""
        messages = [{"role": "user", "content": content}]
        n = await count({"messages": messages})
        if n is not None:
            return n
        try:
            r = await client.post(cfg.base_url + "/apply-template", json={"messages": messages}, headers=cfg.headers(),
                                  timeout=30.0)
            prompt = r.json().get("prompt") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            prompt = None
        return await count({"prompt": prompt}) if isinstance(prompt, str) else None

    plain = await count({"prompt": sample})
    if not plain:
        return Calibration()
    specials = await count({"prompt": ""}) or 0
    chars_per_token = len(sample) / max(1, plain - specials)
    chat = await count_chat(sample)
    template = chat - plain + specials if chat is not None else DEFAULT_TEMPLATE_TOKENS
    fixed = []
    for turn in (1, 2):
        n = await count({"prompt": probe_conv.fixed_text(turn)})
        fixed.append(n - specials if n is not None else round(len(probe_conv.fixed_text(turn)) / chars_per_token))
    return Calibration(chars_per_token=chars_per_token, template_tokens=max(0, template), fixed_tokens=(fixed[0], fixed[1]),
                       tokenize_field=field[0] if field else None, special_tokens=specials)


