"""Deployments bigger than one server, simulated: N replicas, or a
prefill/decode split (a prefill engine, a decode engine and a proxy in front),
each engine with its own port and /metrics.

The proxy does what vLLM's disaggregated-prefill examples do: it sends each
request to the prefill server with max_tokens 1 (the prompt's KV is computed
there), then the original request to the decode server, marked with
kv_transfer_params so the simulated decode engine waits the modelled KV
transfer before it decodes, and streams the decode server's answer back.
It fronts real servers the same way (vLLM's ExampleConnector finds the KV by
prompt, and ignores the mark).
"""

from __future__ import annotations

import asyncio
import re
import socket
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rampwatch.drivers.sim.gpus import DCGM_PATH
from rampwatch.drivers.sim.profiles import SimProfile
from rampwatch.drivers.sim.server import SimFaults, SimServer, error_response, uvicorn_server

_FORWARDED = ("authorization", "content-type")


class PdProxy:
    """The front of a prefill/decode split: prefill first, then decode's stream."""

    def __init__(self, prefill_url: str, decode_url: str):
        self.prefill, self.decode = prefill_url.rstrip("/"), decode_url.rstrip("/")
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self.generate, methods=["POST"]),
            Route("/v1/completions", self.generate, methods=["POST"]),
            Route("/tokenize", self.forward_prefill, methods=["POST"]),
            Route("/v1/models", self.forward_decode),
            Route("/version", self.forward_decode),
            Route("/health", self.health),
        ])

    @staticmethod
    def _headers(request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k in _FORWARDED}

    async def _forward(self, base: str, request: Request) -> Response:
        try:
            r = await self.client.request(request.method, base + request.url.path, content=await request.body(),
                                          headers=self._headers(request))
        except httpx.HTTPError as e:
            return error_response(502, f"upstream {base} unreachable: {type(e).__name__}", "ProxyError")
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    async def forward_prefill(self, request: Request) -> Response:
        return await self._forward(self.prefill, request)

    async def forward_decode(self, request: Request) -> Response:
        return await self._forward(self.decode, request)

    async def health(self, request: Request) -> Response:
        try:
            codes = await asyncio.gather(*(self.client.get(u + "/health", timeout=5.0) for u in (self.prefill, self.decode)))
        except httpx.HTTPError:
            return Response(status_code=503)
        return Response(status_code=200 if all(c.status_code == 200 for c in codes) else 503)

    async def generate(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            return error_response(400, f"invalid request: {e}")
        path, headers = request.url.path, self._headers(request)
        first = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "min_tokens", "ignore_eos")}
        first.update(max_tokens=1, stream=False)
        first.pop("max_completion_tokens", None)
        try:
            r = await self.client.post(self.prefill + path, json=first, headers=headers)
        except httpx.HTTPError as e:
            return error_response(502, f"prefill server unreachable: {type(e).__name__}", "ProxyError")
        if r.status_code != 200:
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        body["kv_transfer_params"] = {"do_remote_prefill": True, "remote_engine": "prefill"}
        try:
            up = await self.client.send(self.client.build_request("POST", self.decode + path, json=body, headers=headers),
                                        stream=True)
        except httpx.HTTPError as e:
            return error_response(502, f"decode server unreachable: {type(e).__name__}", "ProxyError")
        return StreamingResponse(up.aiter_raw(), status_code=up.status_code, media_type=up.headers.get("content-type"),
                                 background=BackgroundTask(up.aclose))


_TOPOLOGY = re.compile(r"^(single|pd|replicas:([1-9][0-9]?))$")


@dataclass(frozen=True)
class Topology:
    """`single`, `replicas:N` or `pd`: which servers to start, each on its own socket."""

    kind: str  # single | replicas | pd
    replicas: int = 1

    @classmethod
    def parse(cls, text: str) -> Topology:
        m = _TOPOLOGY.match(text.strip())
        if m is None:
            raise ValueError(f"not a topology: {text!r} (use single, replicas:N or pd)")
        if m.group(2):
            return cls("replicas", int(m.group(2)))
        return cls(m.group(1))

    @property
    def sockets(self) -> int:
        """Listening sockets it needs: one per replica; proxy, prefill and decode for a split."""
        return 3 if self.kind == "pd" else self.replicas

    def describe(self, urls: list[str], gpus: int = 0) -> list[str]:
        extra = f", {DCGM_PATH} for {gpus} simulated GPUs" if gpus else ""
        if self.kind == "pd":
            return [f"proxy (send turns here) {urls[0]}", f"prefill engine {urls[1]}  (/metrics{extra})",
                    f"decode engine {urls[2]}  (/metrics{extra})"]
        return [f"engine {k + 1} {u}  (/metrics{extra})" for k, u in enumerate(urls)]

    def targets(self, urls: list[str]) -> tuple[list[str], list[str]]:
        """(servers to send turns to, --metrics-url specs; empty: each server's own /metrics)."""
        if self.kind == "pd":
            return [urls[0]], [f"prefill:prefill={urls[1]}/metrics", f"decode:decode={urls[2]}/metrics"]
        return list(urls), []

    def run_args(self, urls: list[str], gpus: int = 0) -> list[str]:
        """How `rampwatch run` reaches these servers (and their simulated GPUs)."""
        targets, specs = self.targets(urls)
        gpu_args = [a for engine in self.engines(urls) for a in ("--gpu", engine + DCGM_PATH)] if gpus else []
        return [*targets, *(a for spec in specs for a in ("--metrics-url", spec)), *gpu_args]

    def engines(self, urls: list[str]) -> list[str]:
        """The URLs of the simulated engines (each serves /metrics, and /dcgm/metrics with --gpus)."""
        return urls[1:] if self.kind == "pd" else list(urls)

    def nodes(self, node: str) -> list[str]:
        """Each engine's node name: `node` alone, else numbered, or by role in a split."""
        if self.kind == "pd":
            return [f"{node}-prefill", f"{node}-decode"]
        return [node] if self.replicas == 1 else [f"{node}-{k + 1}" for k in range(self.replicas)]


def apps(topology: Topology, profile: SimProfile, faults: SimFaults, api_key: str | None, urls: list[str],
         server: dict[str, Any]) -> list[Any]:
    """One ASGI app per socket, in the order of `urls`. `server`: each engine's SimServer options
    (gpus, flavor, cache_report; `node` names the first and is numbered or suffixed for the others)."""
    names = topology.nodes(server.get("node", "sim-node"))
    opts = {k: v for k, v in server.items() if k != "node"}
    if topology.kind == "pd":
        return [PdProxy(urls[1], urls[2]).app, SimServer(profile, api_key=api_key, node=names[0], **opts).app,
                SimServer(profile, faults=faults, api_key=api_key, node=names[1], **opts).app]
    # Fault knobs are shared by the replicas: POST /sim/faults on one sets them for all.
    return [SimServer(profile, faults=faults, api_key=api_key, node=n, **opts).app for n in names]


async def serve_all(apps_: list[Any], sockets: list[socket.socket]) -> None:
    """Every app on its socket in this event loop, until one stops (Ctrl-C or SIGTERM stops all)."""
    servers = [uvicorn_server(app) for app in apps_]
    tasks = [asyncio.create_task(s.serve(sockets=[sock])) for s, sock in zip(servers, sockets)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
