"""What the server is: its model, context limit and engine, and its tokenizer's
figures, learned before any ramp traffic so bad input fails fast."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from rampwatch.drivers.client.ramp import DEFAULT_TEMPLATE_TOKENS, Calibration, Conversation, Filler
from rampwatch.drivers.client.tokenizer import ServerTokenizer, over_httpx
from rampwatch.drivers.net.tls import is_untrusted
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
            raise BadInput(
                f"{where}: its TLS certificate is not trusted (give its CA with --ca-bundle PATH, "
                "or skip verification with --insecure)"
            ) from None
        raise BadInput(f"cannot reach {where}: {type(e).__name__} (is the server up?)") from None
    if r.status_code in (401, 403):
        raise BadInput(f"{where} refused the request (HTTP {r.status_code}): check --api-key-env / --api-key-file")
    try:
        data = r.json()["data"]
        models = [m["id"] for m in data]
    except (ValueError, KeyError, TypeError):
        raise BadInput(
            f"{where} is not an OpenAI-compatible server (GET /v1/models gave HTTP {r.status_code})"
        ) from None
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


async def probe_servers(client: httpx.AsyncClient, cfg: RunConfig, check: bool = True) -> ServerInfo:
    """The first server's info, once every server given serves its model and (`check`) fits the ramp; BadInput
    otherwise."""
    info = await probe(client, cfg)
    for base in cfg.base_urls[1:]:
        other = await probe(client, cfg, base)
        if other.model != info.model:
            raise BadInput(
                f"{base} serves {other.model!r}, not {info.model!r} like {cfg.base_url}: "
                "pass --model to choose one they all serve"
            )
        if check:
            check_schedule(cfg, other)
    if check:
        check_schedule(cfg, info)
    return info


def check_schedule(cfg: RunConfig, info: ServerInfo) -> None:
    out = cfg.max_tokens or cfg.output_tokens  # what each request asks for
    if info.max_model_len and cfg.schedule[-1] + out > info.max_model_len:
        raise BadInput(
            f"the ramp's last turn ({cfg.schedule[-1]:,} tokens + {out} output) exceeds the server's "
            f"max_model_len {info.max_model_len:,}; try --scale-to {_suggest(info.max_model_len - out)}"
        )


def _suggest(limit: int) -> str:
    k = int(limit * 0.95) // 1024
    return f"{k}k" if k else str(int(limit * 0.95))


CALIBRATION_CHARS = 20_000


async def calibrate(
    client: httpx.AsyncClient, cfg: RunConfig, model: str, probe_conv: Conversation, sample: str | None = None
) -> Calibration:
    """Measure the server's tokenizer once: new text's chars per token (on `sample`, the run's own kind of
    text; default pseudo-words), chat-template tokens around a message, and the needle's fixed text. Falls
    back to rough figures where /tokenize is missing (usage then corrects from turn 2)."""
    sample = sample or Filler(random.Random(7)).text(CALIBRATION_CHARS)
    tok = ServerTokenizer(over_httpx(client, cfg.base_url, cfg.headers()), model)
    plain = await tok.raw(sample)
    if not plain:
        return Calibration()
    specials = tok.special_tokens = await tok.raw("") or 0
    chars_per_token = len(sample) / max(1, plain - specials)
    chat = await tok.prompt(sample)
    template = chat - plain + specials if chat is not None else DEFAULT_TEMPLATE_TOKENS
    fixed = []
    for turn in (1, 2):
        n = await tok.text(probe_conv.fixed_text(turn))
        fixed.append(n if n is not None else round(len(probe_conv.fixed_text(turn)) / chars_per_token))
    return Calibration(
        chars_per_token=chars_per_token,
        template_tokens=max(0, template),
        fixed_tokens=(fixed[0], fixed[1]),
        tokenize_field=tok.field,
        special_tokens=specials,
    )
