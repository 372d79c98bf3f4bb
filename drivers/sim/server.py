"""The simulated engine's HTTP surface: vLLM's shapes on starlette + uvicorn.

Everything it serves says it is simulated: /v1/models owned_by, /version,
and the engine name rampwatch records. Fault knobs (for the reliability
tests) are set at start or at run time through POST /sim/faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from dataclasses import asdict, dataclass, fields
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import rampwatch.drivers as drivers
from rampwatch.drivers.sim.gpus import DCGM_PATH, SimGpus
from rampwatch.drivers.sim.engine import SimEngine, SimRequest, StepStats, count_tokens, render_chat
from rampwatch.drivers.sim.profiles import PROFILES, SimProfile

OWNED_BY = "rampwatch-sim"
SGLANG_VERSION = "0.5.23"  # the release whose metric names the sglang flavour serves
MODEL = "sim-model"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQ_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


@dataclass
class SimFaults:
    """Fault knobs. A count says how many of the next requests it hits; -1 means every one."""

    fail_status: int = 500
    fail_requests: int = 0
    drop_after_tokens: int = 0
    drop_requests: int = 0
    error_after_tokens: int = 0
    error_requests: int = 0
    stall_s: float = 0.0
    stall_requests: int = 0
    metrics: str = "ok"  # ok | 404 | malformed | slow

    def take(self, name: str) -> bool:
        n = getattr(self, name)
        if n == 0:
            return False
        if n > 0:
            setattr(self, name, n - 1)
        return True

    def update(self, data: dict[str, Any]) -> None:
        known = {f.name: f.type for f in fields(self)}
        for k, v in data.items():
            if k not in known:
                raise ValueError(f"unknown fault knob: {k}")
            setattr(self, k, v)


class SimMetrics:
    """vLLM's metric names and labels, in a registry of this server's own."""

    def __init__(self, profile: SimProfile, model: str):
        self.registry = r = CollectorRegistry()
        lab = {"model_name": model, "engine": "0"}
        names = list(lab)

        def g(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, names + list(extra), registry=r)

        def c(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, names + list(extra), registry=r)

        def h(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.").labels(**lab)
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**lab)
        self.kv = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**lab)
        self.queries = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.").labels(**lab)
        self.hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(**lab)
        self.prompt = c("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**lab)
        by_source = c("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",))
        self.computed = by_source.labels(**lab, source="local_compute")
        self.cache_hit = by_source.labels(**lab, source="local_cache_hit")
        self.external = by_source.labels(**lab, source="external_kv_transfer")
        self.ext_queries = c("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector "
                             "cross-instance cache sharing, in terms of number of queried tokens.").labels(**lab)
        self.ext_hits = c("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector "
                          "cross-instance cache sharing, in terms of number of cached tokens.").labels(**lab)
        self.generation = c("vllm:generation_tokens", "Number of generation tokens processed.").labels(**lab)
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(**lab)
        success = c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))
        self.success = {reason: success.labels(**lab, finished_reason=reason) for reason in ("stop", "length", "abort", "error", "repetition")}
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS).labels(**lab)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS).labels(**lab)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQ_BUCKETS).labels(**lab)
        self.queue = h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQ_BUCKETS).labels(**lab)
        self.prefill = h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQ_BUCKETS).labels(**lab)
        self.decode = h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQ_BUCKETS).labels(**lab)
        self.iteration = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", names,
                                   buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), registry=r).labels(**lab)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["block_size", "enable_prefix_caching", "engine", "kv_cache_size_tokens", "num_gpu_blocks", "simulated"], registry=r)
        info.labels(block_size=str(profile.block_size), enable_prefix_caching="True", engine="0",
                    kv_cache_size_tokens=str(profile.kv_tokens), num_gpu_blocks=str(profile.kv_tokens // profile.block_size),
                    simulated="True").set(1.0)

    def render(self, engine: SimEngine) -> bytes:
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv.set(engine.pool.usage())
        return generate_latest(self.registry)

    def stats(self) -> StepStats:
        def admit(r: SimRequest) -> None:
            # As vLLM counts a KV connector's tokens: local hits stay local, the transferred rest is external.
            external = r.cached_tokens - r.local_cached
            self.queries.inc(r.prompt_tokens)
            self.hits.inc(r.local_cached)
            self.prompt.inc(r.prompt_tokens)
            self.computed.inc(r.prompt_tokens - r.cached_tokens)
            self.cache_hit.inc(r.local_cached)
            if r.remote_kv:
                self.external.inc(external)
                self.ext_queries.inc(r.prompt_tokens - r.local_cached)
                self.ext_hits.inc(external)
            self.queue.observe((r.scheduled_t or r.arrival) - r.arrival)

        def first(r: SimRequest) -> None:
            self.ttft.observe(r.first_t - r.arrival)  # type: ignore[operator]
            self.prefill.observe(r.first_t - (r.scheduled_t or r.arrival))  # type: ignore[operator]
            self.generation.inc()

        def token(r: SimRequest, dt: float) -> None:
            self.itl.observe(dt)
            self.generation.inc()

        def finish(r: SimRequest) -> None:
            self.success[r.finish_reason or "stop"].inc()
            now = time.monotonic()
            self.e2e.observe(now - r.arrival)
            if r.first_t is not None:
                self.decode.observe((r.last_t or now) - r.first_t)

        return StepStats(on_admit=admit, on_first=first, on_token=token, on_finish=finish,
                         on_step=self.iteration.observe, on_preempt=lambda r: self.preemptions.inc())


class SglangMetrics:
    """SGLang 0.5's metric names and labels (scheduler series with engine_type and ranks), served as its
    multiprocess collector does (no _created series). Like SGLang releases without
    sglang:cached_tokens_total, nothing here counts prefix-cache hits: only sglang:cache_hit_rate, the
    ratio of the last report."""

    def __init__(self, profile: SimProfile, model: str):
        self.registry = r = CollectorRegistry()
        sched = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        tok = {"model_name": model, "engine_type": "unified"}

        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(sched), registry=r, multiprocess_mode="mostrecent").labels(**sched)

        self.running = g("sglang:num_running_reqs", "The number of running requests.")
        self.waiting = g("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.kv = g("sglang:token_usage", "The token usage.")
        self.kv_used = g("sglang:kv_used_tokens", "The number of used KV tokens.")
        self.capacity = g("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.capacity.set(profile.kv_tokens)
        self.hit_ratio = g("sglang:cache_hit_rate", "The prefix cache hit rate (of the last report).")
        self.gen_throughput = g("sglang:gen_throughput", "The generation throughput (token/s).")
        self.prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", list(tok), registry=r).labels(**tok)
        self.generation = Counter("sglang:generation_tokens", "Number of generation tokens processed.", list(tok), registry=r).labels(**tok)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              list(tok), buckets=TTFT_BUCKETS, registry=r).labels(**tok)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             list(tok), buckets=ITL_BUCKETS, registry=r).labels(**tok)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             list(tok), buckets=REQ_BUCKETS, registry=r).labels(**tok)
        self._generated = 0  # tokens generated so far, for gen_throughput
        self._last_gen = (time.monotonic(), 0)

    def stats(self) -> StepStats:
        def admit(r: SimRequest) -> None:
            self.prompt.inc(r.prompt_tokens)
            self.hit_ratio.set(r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0)

        def first(r: SimRequest) -> None:
            self.ttft.observe(r.first_t - r.arrival)  # type: ignore[operator]
            self._generate()

        def token(r: SimRequest, dt: float) -> None:
            self.itl.observe(dt)
            self._generate()

        def finish(r: SimRequest) -> None:
            self.e2e.observe(time.monotonic() - r.arrival)

        return StepStats(on_admit=admit, on_first=first, on_token=token, on_finish=finish)

    def _generate(self) -> None:
        self.generation.inc()
        self._generated += 1

    def render(self, engine: SimEngine) -> bytes:
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv.set(engine.pool.usage())
        self.kv_used.set(engine.pool.used * engine.profile.block_size)
        now, generated = time.monotonic(), self._generated
        t0, g0 = self._last_gen
        if now - t0 > 0.5:
            self.gen_throughput.set((generated - g0) / (now - t0))
            self._last_gen = (now, generated)
        text = generate_latest(self.registry)
        return b"\n".join(line for line in text.split(b"\n") if b"_created" not in line)


FLAVORS = ("vllm", "sglang")


class ChatBody(msgspec.Struct):
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


class RequireKey:
    """ASGI middleware: every request but /health needs `Authorization: Bearer <key>`."""

    def __init__(self, app: Any, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await error_response(401, "invalid or missing API key", "AuthenticationError")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def error_response(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status)


_enc = msgspec.json.encode


class SimServer:
    """One simulated vLLM server: engine, metrics and routes."""

    def __init__(self, profile: SimProfile, model: str = MODEL, faults: SimFaults | None = None, api_key: str | None = None,
                 gpus: int = 0, node: str = "sim-node", flavor: str = "vllm", cache_report: bool = False):
        """`gpus` > 0: also serve a simulated dcgm-exporter for that many GPUs of node `node` at /dcgm/metrics.
        `flavor` sglang: SGLang's metric names, /get_model_info and /get_server_info, and cached tokens in
        usage only with `cache_report` (SGLang's --enable-cache-report)."""
        self.profile, self.model, self.api_key, self.flavor = profile, model, api_key, flavor
        self.cache_report = cache_report or flavor == "vllm"
        self.faults = faults or SimFaults()
        self.metrics: SimMetrics | SglangMetrics = SglangMetrics(profile, model) if flavor == "sglang" else SimMetrics(profile, model)
        self.engine = SimEngine(profile, self.metrics.stats())
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
                *([Route(p, self.model_info) for p in ("/get_model_info", "/model_info")]
                  + [Route(p, self.server_info) for p in ("/get_server_info", "/server_info")] if flavor == "sglang" else []),
            ],
            lifespan=self._lifespan,
            middleware=[Middleware(RequireKey, key=api_key)] if api_key else [],
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(self.engine.run())
        try:
            yield
        finally:
            task.cancel()

    # -- endpoints -----------------------------------------------------------

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.created,
            "owned_by": "sglang" if self.flavor == "sglang" else OWNED_BY, "root": self.model,
            "parent": None, "max_model_len": self.profile.max_model_len, "permission": [],
        }]})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": self.model, "tokenizer_path": self.model, "is_generation": True,
                             "preferred_sampling_params": None, "simulated": True})

    async def server_info(self, request: Request) -> Response:
        return JSONResponse({"version": f"{SGLANG_VERSION}-simulated", "simulated": True, "model_path": self.model,
                             "context_length": self.profile.max_model_len, "max_total_num_tokens": self.profile.kv_tokens,
                             "enable_metrics": True, "enable_cache_report": self.cache_report,
                             "chunked_prefill_size": self.profile.max_num_batched_tokens})

    async def version(self, request: Request) -> Response:
        version = SGLANG_VERSION if self.flavor == "sglang" else drivers.__version__
        return JSONResponse({"version": f"{version}-simulated", "simulated": True, "profile": self.profile.name})

    async def metrics_endpoint(self, request: Request) -> Response:
        mode = self.faults.metrics
        if mode == "404":
            return Response("Not Found", status_code=404)
        if mode == "malformed":
            return Response("vllm:num_requests_running{engine=\"0\" 1 2 3\n<html>oops</html>\n", media_type="text/plain")
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
        n = count_tokens(data, self.profile.chars_per_token)
        return JSONResponse({"count": n, "max_model_len": self.profile.max_model_len, "tokens": [], "token_strs": None})

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool) -> Response:
        f = self.faults
        if f.take("stall_requests"):
            await asyncio.sleep(f.stall_s)
        if f.take("fail_requests"):
            return error_response(f.fail_status, "simulated server error", "InternalServerError" if f.fail_status >= 500 else "BadRequestError")
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
            return error_response(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{n + max_tokens} tokens ({n} in the messages, {max_tokens} in the completion). "
                               "Please reduce the length of the messages or completion.")
        req = self.engine.make_request(prompt, max_tokens, body.ignore_eos or body.min_tokens >= max_tokens)
        if (body.kv_transfer_params or {}).get("do_remote_prefill"):
            # Only what this node's prefix cache lacks crosses the link; the request waits for it.
            req.remote_kv = True
            moved = max(0, req.prompt_tokens - self.engine.cached_prefix(req.hashes))
            req.ready_at = time.monotonic() + self.profile.transfer_time(moved)
        self.engine.submit(req)
        if body.stream:
            usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(self._stream(req, chat, usage), media_type="text/event-stream")
        try:
            while not req.finished:
                await req.wake.wait()
                req.wake.clear()
        except asyncio.CancelledError:
            self.engine.abort(req)
            raise
        text = "".join(req.out)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": req.finish_reason}
                  if chat else {"index": 0, "text": text, "finish_reason": req.finish_reason})
        return JSONResponse({
            "id": f"{'chatcmpl' if chat else 'cmpl'}-sim{req.id}", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.model, "choices": [choice], "usage": self._usage(req),
        })

    def _usage(self, req: SimRequest) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + req.generated,
                                 "completion_tokens": req.generated}
        if self.cache_report:
            usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
        return usage

    async def _stream(self, req: SimRequest, chat: bool, include_usage: bool):  # type: ignore[no-untyped-def]
        f = self.faults
        drop_after = f.drop_after_tokens if f.take("drop_requests") else 0
        error_after = f.error_after_tokens if f.take("error_requests") else 0
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = (b'data: {"id":"chatcmpl-sim%d","object":"%s","created":%d,"model":%s,"choices":['
                % (req.id, kind.encode(), created, _enc(self.model)))
        if chat:
            pre, post = b'{"index":0,"delta":{"content":', b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            pre, post = b'{"index":0,"text":', b',"logprobs":null,"finish_reason":null}]}\n\n'
        sent = 0
        try:
            if chat:
                yield head + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
            while True:
                await req.wake.wait()
                req.wake.clear()
                words, req.out = req.out, []
                if words:
                    out = []
                    for w in words:
                        sent += 1
                        if error_after and sent > error_after:
                            err = {"error": {"message": "simulated error inside the stream", "type": "InternalServerError", "param": None, "code": 500}}
                            yield b"".join(out) + b"data: " + _enc(err) + b"\n\ndata: [DONE]\n\n"
                            self.engine.abort(req)
                            return
                        if drop_after and sent > drop_after:
                            if out:
                                yield b"".join(out)
                            self.engine.abort(req)
                            raise SimulatedDrop("simulated connection drop")
                        out.append(head + pre + _enc(w) + post)
                    yield b"".join(out)
                if req.finished:
                    break
            final = b'{"index":0,"delta":{},"logprobs":null,"finish_reason":%s}]}\n\n' if chat else b'{"index":0,"text":"","logprobs":null,"finish_reason":%s}]}\n\n'
            tail = [head + final % _enc(req.finish_reason)]
            if include_usage:
                tail.append(head + b'],"usage":' + _enc(self._usage(req)) + b"}\n\n")
            tail.append(b"data: [DONE]\n\n")
            yield b"".join(tail)
        finally:
            if not req.finished:
                self.engine.abort(req)  # the client went away mid-stream


def make_profile(name: str, **overrides: Any) -> SimProfile:
    base = PROFILES[name]
    return base.scaled(**{k: v for k, v in overrides.items() if v is not None})


def loopback_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.set_inheritable(True)
    return sock


class _QuietDrops(logging.Filter):
    """The sim's deliberate drops (a fault knob) and requests cut at shutdown are not errors to log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, (SimulatedDrop, asyncio.CancelledError))


class SimulatedDrop(ConnectionAbortedError):
    """Raised inside a stream to cut the connection (fault knob drop_after_tokens)."""


logging.getLogger("uvicorn.error").addFilter(_QuietDrops())


def uvicorn_server(app: Any, tls: tuple[str, str] | None = None) -> uvicorn.Server:
    """`tls`: (certificate, key) PEM files to serve https."""
    # Shutdown drops open streams after a second instead of waiting for them (like a crashed server).
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=3600,
                            timeout_graceful_shutdown=1, ssl_certfile=tls[0] if tls else None,
                            ssl_keyfile=tls[1] if tls else None)
    return uvicorn.Server(config)


class ThreadedServer:
    """An ASGI app on a loopback port, in a thread of its own (tests)."""

    def __init__(self, app: Any, port: int = 0, tls: tuple[str, str] | None = None):
        self.sock = loopback_socket(port=port)
        self.port = self.sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.server = uvicorn_server(app, tls)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class ThreadedSim(ThreadedServer):
    """A simulated server on a loopback port, in a thread of its own (tests)."""

    def __init__(self, profile: SimProfile, faults: SimFaults | None = None, port: int = 0, api_key: str | None = None,
                 tls: tuple[str, str] | None = None, **server: Any):
        """`server`: SimServer's options (gpus, node, flavor, cache_report)."""
        self.sim = SimServer(profile, faults=faults, api_key=api_key, **server)
        super().__init__(self.sim.app, port, tls)

    def __enter__(self) -> ThreadedSim:
        super().__enter__()
        return self
