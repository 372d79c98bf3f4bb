"""The front of a simulated prefill/decode split, as vLLM's disaggregated-prefill
examples do it: each request goes to the prefill server with max_tokens 1 (the
prompt's KV is computed there), then the original request to the decode server,
marked with kv_transfer_params so the simulated decode engine waits the modelled
KV transfer before it decodes; the decode server's answer streams back, its
headers saying how long the prefill leg took (x-prefill-leg-ms).
It fronts real servers the same way (vLLM's ExampleConnector finds the KV by
prompt, and ignores the mark).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rampwatch.drivers.sim.errors import error_response

_FORWARDED = ("authorization", "content-type")
# The response header that says how long the prefill server took with the request (its leg, in ms): a client
# sets it beside its TTFT to see what the KV transfer and the decode server's first step took.
PREFILL_LEG_HEADER = "x-prefill-leg-ms"


def upstream_client() -> httpx.AsyncClient:
    """The client a simulated front (this split's proxy, the router) reaches its servers with: no timeout on a
    long prefill, no proxy from the environment, many kept-alive connections."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=10.0),
        trust_env=False,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )


async def forward(client: httpx.AsyncClient, base: str, request: Request, headers: dict[str, str]) -> Response:
    """`request` sent on to the server at `base` as it came (same method, path and body), its answer returned."""
    try:
        r = await client.request(request.method, base + request.url.path, content=await request.body(), headers=headers)
    except httpx.HTTPError as e:
        return error_response(502, f"upstream {base} unreachable: {type(e).__name__}", "ProxyError")
    return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))


async def json_object(request: Request) -> tuple[bytes, dict] | Response:
    """A generate request's body as sent and as a JSON object, or the 400 a server answers for anything else."""
    raw = await request.body()
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        return error_response(400, f"invalid request: {e}")
    if not isinstance(body, dict):
        return error_response(400, "invalid request: not a JSON object")
    return raw, body


def streamed(up: httpx.Response, headers: dict[str, str]) -> StreamingResponse:
    """An upstream stream passed on as it comes, closed once passed (or the client gone)."""
    return StreamingResponse(
        up.aiter_raw(),
        status_code=up.status_code,
        media_type=up.headers.get("content-type"),
        headers=headers,
        background=BackgroundTask(up.aclose),
    )


class PdProxy:
    """The front of a prefill/decode split: prefill first, then decode's stream."""

    def __init__(self, prefill_url: str, decode_url: str):
        self.prefill, self.decode = prefill_url.rstrip("/"), decode_url.rstrip("/")
        self.client = upstream_client()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.generate, methods=["POST"]),
                Route("/v1/completions", self.generate, methods=["POST"]),
                Route("/tokenize", self.forward_prefill, methods=["POST"]),
                Route("/v1/models", self.forward_decode),
                Route("/version", self.forward_decode),
                Route("/health", self.health),
            ]
        )

    @staticmethod
    def _headers(request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k in _FORWARDED}

    async def _forward(self, base: str, request: Request) -> Response:
        return await forward(self.client, base, request, self._headers(request))

    async def forward_prefill(self, request: Request) -> Response:
        return await self._forward(self.prefill, request)

    async def forward_decode(self, request: Request) -> Response:
        return await self._forward(self.decode, request)

    async def health(self, request: Request) -> Response:
        try:
            codes = await asyncio.gather(
                *(self.client.get(u + "/health", timeout=5.0) for u in (self.prefill, self.decode))
            )
        except httpx.HTTPError:
            return Response(status_code=503)
        return Response(status_code=200 if all(c.status_code == 200 for c in codes) else 503)

    async def generate(self, request: Request) -> Response:
        got = await json_object(request)
        if isinstance(got, Response):
            return got
        _, body = got
        path, headers = request.url.path, self._headers(request)
        first = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "min_tokens", "ignore_eos")}
        first.update(max_tokens=1, stream=False)
        first.pop("max_completion_tokens", None)
        started = time.monotonic()
        try:
            r = await self.client.post(self.prefill + path, json=first, headers=headers)
        except httpx.HTTPError as e:
            return error_response(502, f"prefill server unreachable: {type(e).__name__}", "ProxyError")
        leg_ms = (time.monotonic() - started) * 1000
        if r.status_code != 200:
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        body["kv_transfer_params"] = {"do_remote_prefill": True, "remote_engine": "prefill"}
        try:
            up = await self.client.send(
                self.client.build_request("POST", self.decode + path, json=body, headers=headers), stream=True
            )
        except httpx.HTTPError as e:
            return error_response(502, f"decode server unreachable: {type(e).__name__}", "ProxyError")
        return streamed(up, {PREFILL_LEG_HEADER: f"{leg_ms:.1f}"})
