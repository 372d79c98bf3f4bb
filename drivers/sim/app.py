"""The simulated engine's HTTP surface: vLLM's shapes (or SGLang's) on starlette.

Everything it serves says it is simulated: /v1/models owned_by, /version,
and the engine name rampwatch records. Fault knobs (for the reliability
tests) are set at start or at run time through POST /sim/faults. (A little over ~400 lines: one handler
per route of the surface it imitates, read together; the engine, its cache and its metrics live beside it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# The package root holds only rampwatch's version (it imports nothing), which /version reports.
from rampwatch.drivers import __version__
from rampwatch.drivers.sim.auth import RequireKey
from rampwatch.drivers.sim.clock import SimClock
from rampwatch.drivers.sim.engine import SimEngine, SimRequest, count_tokens, render_chat, token_ids
from rampwatch.drivers.sim.errors import error_response
from rampwatch.drivers.sim.faults import SimFaults, SimulatedDrop
from rampwatch.drivers.sim.gpus import DCGM_PATH, SimGpus
from rampwatch.drivers.sim.profiles import SimProfile
from rampwatch.drivers.sim.repeating import RepeatingEvents
from rampwatch.drivers.sim.surfaces import metrics_for
from rampwatch.drivers.sim.traces import SpanExporter

OWNED_BY = "rampwatch-sim"
SGLANG_VERSION = "0.5.23"  # the release whose metric names the sglang flavour serves
MODEL = "sim-model"


class ChatBody(msgspec.Struct):
    """A chat or text completion request (also /tokenize's), as far as the simulated engine reads it."""

    model: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None  # from a prefill/decode proxy: the KV is on the prefill node
    chat_template_kwargs: dict[str, Any] | None = None  # enable_thinking / thinking false: no reasoning


_enc = msgspec.json.encode


class SimServer:
    """One simulated vLLM server: engine, metrics and routes."""

    def __init__(
        self,
        profile: SimProfile,
        model: str = MODEL,
        faults: SimFaults | None = None,
        api_key: str | None = None,
        gpus: int = 0,
        node: str = "sim-node",
        flavor: str = "vllm",
        cache_report: bool = False,
        clock: SimClock | None = None,
        reasoning_tokens: int = 0,
        per_request_metrics: bool = False,
        otlp_traces_endpoint: str | None = None,
        instance: str = "",
    ):
        """`gpus` > 0: also serve a simulated dcgm-exporter for that many GPUs of node `node` at /dcgm/metrics.
        `flavor` sglang: SGLang's metric names, /get_model_info and /get_server_info, and cached tokens in
        usage only with `cache_report` (SGLang's --enable-cache-report). `clock`: the engine's (the wall's
        unless a test checks the model on a virtual one).
        `reasoning_tokens` > 0: a reasoning model that thinks that many tokens before each chat answer (unless the
        request's chat_template_kwargs switch thinking off).
        `per_request_metrics`: vLLM's --enable-per-request-metrics, the engine's own timing of each request beside
        usage. `otlp_traces_endpoint`: vLLM's --otlp-traces-endpoint, one `llm_request` span per request POSTed
        there (OTLP/HTTP protobuf) when it ends; `instance` names this engine among its replicas in those spans."""
        self.traces = SpanExporter(otlp_traces_endpoint, instance) if otlp_traces_endpoint else None
        self.profile, self.model, self.api_key, self.flavor = profile, model, api_key, flavor
        self.per_request_metrics = per_request_metrics
        self.reasoning_tokens = reasoning_tokens
        self.cache_report = cache_report or flavor == "vllm"
        self.faults = faults or SimFaults()
        self.metrics = metrics_for(flavor, profile, model)
        self.engine = SimEngine(profile, self.metrics.stats(), clock=clock)
        self.gpus = SimGpus(self.engine, gpus, node) if gpus > 0 else None
        self.created = int(time.time())
        self.app = Starlette(
            routes=[
                *([Route(DCGM_PATH, self.dcgm_endpoint)] if self.gpus else []),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/v1/models", self.models),
                Route("/health", self.health),
                Route("/version", self.version),
                Route("/metrics", self.metrics_endpoint),
                Route("/sim/faults", self.set_faults, methods=["POST", "GET"]),
                *(
                    [Route(p, self.model_info) for p in ("/get_model_info", "/model_info")]
                    + [Route(p, self.server_info) for p in ("/get_server_info", "/server_info")]
                    if flavor == "sglang"
                    else []
                ),
            ],
            lifespan=self._lifespan,
            middleware=[Middleware(RequireKey, key=api_key)] if api_key else [],
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Starlette streams through an anyio task group, and anyio imports its asyncio backend on first use: 40-70
        # ms with the loop held, which the first streamed request (its queue time) and the next one (before it
        # arrives) would carry, the client's TTFT then exceeding the engine's own figures. Imported here instead.
        async with anyio.create_task_group():
            pass
        task = asyncio.create_task(self.engine.run())
        try:
            yield
        finally:
            task.cancel()

    # -- endpoints -----------------------------------------------------------

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "sglang" if self.flavor == "sglang" else OWNED_BY,
                        "root": self.model,
                        "parent": None,
                        "max_model_len": self.profile.max_model_len,
                        "permission": [],
                    }
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": self.model,
                "tokenizer_path": self.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "simulated": True,
            }
        )

    async def server_info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "version": f"{SGLANG_VERSION}-simulated",
                "simulated": True,
                "model_path": self.model,
                "context_length": self.profile.max_model_len,
                "max_total_num_tokens": self.profile.kv_tokens,
                "enable_metrics": True,
                "enable_cache_report": self.cache_report,
                "chunked_prefill_size": self.profile.max_num_batched_tokens,
            }
        )

    async def version(self, request: Request) -> Response:
        version = SGLANG_VERSION if self.flavor == "sglang" else __version__
        return JSONResponse({"version": f"{version}-simulated", "simulated": True, "profile": self.profile.name})

    async def metrics_endpoint(self, request: Request) -> Response:
        mode = self.faults.metrics
        if mode == "404":
            return Response("Not Found", status_code=404)
        if mode == "malformed":
            return Response('vllm:num_requests_running{engine="0" 1 2 3\n<html>oops</html>\n', media_type="text/plain")
        if mode == "slow":
            await asyncio.sleep(10.0)
        return Response(self.metrics.render(self.engine), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def dcgm_endpoint(self, request: Request) -> Response:
        assert self.gpus is not None
        return Response(self.gpus.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def set_faults(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                self.faults.update(msgspec.json.decode(await request.body()))
            except (msgspec.DecodeError, ValueError, TypeError) as e:
                return error_response(400, str(e))
        return JSONResponse(asdict(self.faults))

    async def tokenize(self, request: Request) -> Response:
        try:
            body = msgspec.json.decode(await request.body(), type=ChatBody)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return error_response(400, f"invalid request: {e}")
        if body.messages is not None:
            data = render_chat(body.messages)
        elif body.prompt is not None:
            data = body.prompt.encode()
        else:
            return error_response(400, "either 'prompt' or 'messages' is required")
        ids = token_ids(data, self.profile.chars_per_token)
        reply = {"count": len(ids), "max_model_len": self.profile.max_model_len, "tokens": ids, "token_strs": None}
        return Response(msgspec.json.encode(reply), media_type="application/json")  # a long reply's ids, quickly

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool) -> Response:
        f = self.faults
        if f.take("stall_requests"):
            await asyncio.sleep(f.stall_s)
        if f.take("fail_requests"):
            return error_response(
                f.fail_status,
                "simulated server error",
                "InternalServerError" if f.fail_status >= 500 else "BadRequestError",
            )
        try:
            body = msgspec.json.decode(await request.body(), type=ChatBody)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return error_response(400, f"invalid request: {e}")
        if body.model not in (None, self.model):
            return error_response(404, f"The model `{body.model}` does not exist.", "NotFoundError")
        if chat:
            if not body.messages:
                return error_response(400, "'messages' must be a non-empty list")
            prompt = render_chat(body.messages)
        else:
            if body.prompt is None:
                return error_response(400, "'prompt' is required")
            prompt = body.prompt.encode()
        max_tokens = body.max_completion_tokens or body.max_tokens or 16
        if max_tokens < 1:
            return error_response(400, "max_tokens must be at least 1")
        n = count_tokens(prompt, self.profile.chars_per_token)
        limit = self.profile.max_model_len
        if n + max_tokens > limit:
            return error_response(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
            )
        req = self.engine.make_request(
            prompt, max_tokens, body.ignore_eos or body.min_tokens >= max_tokens, self._reasoning(body) if chat else 0
        )
        front_end = self.profile.front_end_time(req.prompt_tokens)
        if front_end > 0:  # the template and the tokenizer first: the request joins the queue after them
            req.received, req.arrival = req.arrival, req.arrival + front_end
            req.ready_at = req.arrival
        if (body.kv_transfer_params or {}).get("do_remote_prefill"):
            # Only what this node's prefix cache lacks crosses the link; the request waits for it.
            req.remote_kv = True
            moved = max(0, req.prompt_tokens - self.engine.cached_prefix(req.hashes))
            req.ready_at = max(req.ready_at, req.arrival + self.profile.transfer_time(moved))  # the engine's clock
        self.engine.submit(req)
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            ids = (request.headers.get("x-request-id"), request.headers.get("traceparent"))
            return StreamingResponse(self._stream(req, chat, usage, ids), media_type="text/event-stream")
        try:
            while not req.finished:
                await req.wake.wait()
                req.wake.clear()
        except asyncio.CancelledError:
            self.engine.abort(req)
            raise
        if self.traces is not None:
            self.traces.request_ended(req, request.headers.get("x-request-id"), request.headers.get("traceparent"))
        text = req.text(req.reasoning, req.generated)
        message = {"role": "assistant", "content": text}
        if req.reasoning:
            message["reasoning_content"] = req.text(0, min(req.reasoning, req.generated))
        choice = (
            {"index": 0, "message": message, "finish_reason": req.finish_reason}
            if chat
            else {"index": 0, "text": text, "finish_reason": req.finish_reason}
        )
        return JSONResponse(
            {
                "id": f"{'chatcmpl' if chat else 'cmpl'}-sim{req.id}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": self._usage(req),
                **self._metrics(req),
            }
        )

    def _reasoning(self, body: ChatBody) -> int:
        """Tokens to think before answering: none where the request's chat_template_kwargs switch thinking off
        (enable_thinking, Qwen3's switch, or thinking, DeepSeek V3.1's and GLM's)."""
        kwargs = body.chat_template_kwargs or {}
        if kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False:
            return 0
        return self.reasoning_tokens

    def _usage(self, req: SimRequest) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.generated,
            "completion_tokens": req.generated,
        }
        if self.cache_report:
            usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
        if self.reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": min(req.generated, req.reasoning)}
        return usage

    def _metrics(self, req: SimRequest) -> dict[str, Any]:
        """{"metrics": ...} as vLLM's --enable-per-request-metrics puts it beside usage (none without the flag), from
        the engine's own clock: when the request was queued, scheduled, and got its first and last token."""
        if not self.per_request_metrics:
            return {}
        m: dict[str, float] = {}
        if req.scheduled_t is not None:
            m["queue_time_ms"] = (req.scheduled_t - req.arrival) * 1000
            if req.first_t is not None:
                m["time_to_first_token_ms"] = (req.first_t - req.scheduled_t) * 1000
        if req.first_t is not None and req.last_t is not None:
            m["generation_time_ms"] = (req.last_t - req.first_t) * 1000
            if req.generated > 1:
                m["mean_itl_ms"] = m["generation_time_ms"] / (req.generated - 1)
        return {"metrics": m}

    async def _stream(
        self, req: SimRequest, chat: bool, include_usage: bool, ids: tuple[str | None, str | None] = (None, None)
    ) -> AsyncIterator[bytes]:
        """`ids`: the request's X-Request-Id and traceparent, for its span."""
        f = self.faults
        drop_after = f.drop_after_tokens if f.take("drop_requests") else 0
        error_after = f.error_after_tokens if f.take("error_requests") else 0
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = b'data: {"id":"chatcmpl-sim%d","object":"%s","created":%d,"model":%s,"choices":[' % (
            req.id,
            kind.encode(),
            created,
            _enc(self.model),
        )
        if chat:
            pre, post = b'{"index":0,"delta":{"content":', b'},"logprobs":null,"finish_reason":null}]}\n\n'
            thinking = b'{"index":0,"delta":{"reasoning_content":'
        else:
            pre, post = b'{"index":0,"text":', b',"logprobs":null,"finish_reason":null}]}\n\n'
            thinking = pre  # text completions never reason
        sent = 0
        pieces: dict[tuple[str, bool], bytes] = {}  # a word's whole SSE event, built once

        def piece(w: str, thinks: bool) -> bytes:
            built = pieces[(w, thinks)] = head + (thinking if thinks else pre) + _enc(w) + post
            return built

        answers = RepeatingEvents([head + pre + _enc(w) + post for w in req.words])
        try:
            if chat:
                yield (
                    head
                    + b'{"index":0,"delta":{"role":"assistant","content":""},'
                    + b'"logprobs":null,"finish_reason":null}]}\n\n'
                )
            while True:
                await req.wake.wait()
                req.wake.clear()
                upto = req.generated
                if upto > sent and not error_after and not drop_after and sent >= req.reasoning:
                    # No fault to inject and no more thinking: the answer's events in a few slices (the fast path).
                    yield answers.events(sent - req.reasoning, upto - sent)
                    sent = upto
                elif upto > sent:
                    out = []
                    for g in range(sent, upto):
                        sent = g + 1
                        if error_after and sent > error_after:
                            err = {
                                "error": {
                                    "message": "simulated error inside the stream",
                                    "type": "InternalServerError",
                                    "param": None,
                                    "code": 500,
                                }
                            }
                            yield b"".join(out) + b"data: " + _enc(err) + b"\n\ndata: [DONE]\n\n"
                            self.engine.abort(req)
                            return
                        if drop_after and sent > drop_after:
                            if out:
                                yield b"".join(out)
                            self.engine.abort(req)
                            raise SimulatedDrop("simulated connection drop")
                        thinks = req.is_reasoning(g)
                        w = req.word(g)
                        out.append(pieces.get((w, thinks)) or piece(w, thinks))
                    yield b"".join(out)
                # Tokens generated while this stream waited on a slow client are still to go, even once it finished.
                if req.finished and sent >= req.generated:
                    break
            final = (
                b'{"index":0,"delta":{},"logprobs":null,"finish_reason":%s}]}\n\n'
                if chat
                else b'{"index":0,"text":"","logprobs":null,"finish_reason":%s}]}\n\n'
            )
            tail = [head + final % _enc(req.finish_reason)]
            if include_usage:
                metrics = self._metrics(req)
                extra = b',"metrics":' + _enc(metrics["metrics"]) if metrics else b""
                tail.append(head + b'],"usage":' + _enc(self._usage(req)) + extra + b"}\n\n")
            tail.append(b"data: [DONE]\n\n")
            if self.traces is not None:
                self.traces.request_ended(req, *ids)
            yield b"".join(tail)
        finally:
            if not req.finished:
                self.engine.abort(req)  # the client went away mid-stream
