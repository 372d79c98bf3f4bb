"""A simulated router in front of simulated replicas, as vllm-router does it (ENGINES.md §1.11): each generate
request goes whole to one worker, chosen by its policy, and the worker's stream comes back unchanged.

- `consistent_hash` keys on a session header (vllm-router's names: x-session-id, session-id, ...) or the body's
  `session_params.session_id`; a request with neither goes round robin. The ring is the workers in order,
  rotated by one on every restart, so a restart moves every session (the moves a changed ring causes).
- `round_robin` takes the workers in turn, whatever the session.
- A restart (`--router-restart-after N` requests, or POST /sim/router/restart) zeroes its counters as a new
  process would, and rotates the ring.
- /metrics serves vllm-router's names: requests per route, processed requests, policy decisions and health per
  worker (labelled by the worker's URL, as vllm-router labels them).
It names no worker in its responses (vllm-router does not either); the replicas' spans do.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rampwatch.drivers.sim.errors import error_response
from rampwatch.drivers.sim.proxy import forward, json_object, streamed, upstream_client

POLICIES = ("consistent_hash", "round_robin")
# The session headers vllm-router's consistent_hash reads, first found wins.
SESSION_HEADERS = ("x-session-id", "session-id", "x-claude-code-session-id", "x-user-id", "x-tenant-id")
# What reaches the worker: the key, the body's type, and the ids that join the engine's record (its span) to a turn.
_FORWARDED = ("authorization", "content-type", "x-request-id", "traceparent", *SESSION_HEADERS)


def session_key(headers: dict[str, str], body: dict[str, object]) -> str | None:
    """The request's session: the first session header it carries, else the body's session_params.session_id."""
    for name in SESSION_HEADERS:
        if headers.get(name):
            return headers[name]
    params = body.get("session_params")
    sid = params.get("session_id") if isinstance(params, dict) else None
    return str(sid) if sid not in (None, "") else None


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class SimRouter:
    """The router's ASGI app (`app`) in front of `workers` (base URLs)."""

    def __init__(self, workers: list[str], policy: str = "consistent_hash", restart_after: int | None = None):
        if policy not in POLICIES:
            raise ValueError(f"not a router policy: {policy!r} (use {' or '.join(POLICIES)})")
        self.workers = [w.rstrip("/") for w in workers]
        self.policy, self.restart_after = policy, restart_after
        self.generation = 0  # restarts so far: the ring's rotation
        self.forwarded = 0  # generate requests forwarded since the router started (restarts do not reset it)
        self._turn = 0
        self._zero()
        self.client = upstream_client()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.generate, methods=["POST"]),
                Route("/v1/completions", self.generate, methods=["POST"]),
                Route("/tokenize", self.forward_first, methods=["POST"]),
                Route("/v1/models", self.forward_first),
                Route("/version", self.forward_first),
                Route("/health", self.health),
                Route("/metrics", self.metrics),
                Route("/sim/router/restart", self.restart_endpoint, methods=["POST"]),
            ]
        )

    def _zero(self) -> None:
        self.requests: Counter[str] = Counter()  # by route
        self.processed: Counter[str] = Counter()  # by worker
        self.errors: Counter[str] = Counter()  # requests answered with an error, by route
        self.healthy = dict.fromkeys(self.workers, True)

    def restart(self) -> None:
        """As a router process restarted with a changed ring: counters from zero, every key on another worker."""
        self.generation += 1
        self._turn = 0
        self._zero()

    def choose(self, key: str | None) -> str:
        """The worker a request goes to under the policy (`key`: its session, if any)."""
        n = len(self.workers)
        if self.policy == "consistent_hash" and key is not None:
            return self.workers[(_hash(key) + self.generation) % n]
        worker = self.workers[self._turn % n]
        self._turn += 1
        return worker

    async def generate(self, request: Request) -> Response:
        got = await json_object(request)
        if isinstance(got, Response):
            return got
        raw, body = got
        headers = {k: v for k, v in request.headers.items() if k in _FORWARDED}
        worker = self.choose(session_key(headers, body))
        self.requests[request.url.path] += 1
        self.processed[worker] += 1
        self.forwarded += 1
        if self.restart_after and self.forwarded == self.restart_after:
            self.restart()  # after this request is routed: the next one meets the new ring
        try:
            up = await self.client.send(
                self.client.build_request("POST", worker + request.url.path, content=raw, headers=headers),
                stream=True,
            )
        except httpx.HTTPError as e:
            self.healthy[worker] = False
            self.errors[request.url.path] += 1
            return error_response(502, f"worker {worker} unreachable: {type(e).__name__}", "RouterError")
        self.healthy[worker] = True
        back = {k: v for k, v in up.headers.items() if k == "x-request-id"}  # vllm-router returns the id it sent
        return streamed(up, back)

    async def forward_first(self, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k in _FORWARDED}
        return await forward(self.client, self.workers[0], request, headers)

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if any(self.healthy.values()) else 503)

    async def restart_endpoint(self, request: Request) -> Response:
        self.restart()
        return JSONResponse({"restarted": True, "generation": self.generation})

    async def metrics(self, request: Request) -> Response:
        return Response(self.render(), media_type="text/plain; version=0.0.4")

    def render(self) -> str:
        """vllm-router's metric names, as its Prometheus port serves them (counters from this process's start)."""
        lines = ["# TYPE vllm_router_requests_total counter"]
        lines += [f'vllm_router_requests_total{{route="{r}"}} {n}' for r, n in sorted(self.requests.items())]
        lines.append("# TYPE vllm_router_processed_requests_total counter")
        lines += [f'vllm_router_processed_requests_total{{worker="{w}"}} {self.processed[w]}' for w in self.workers]
        lines.append("# TYPE vllm_router_policy_decisions_total counter")
        lines += [
            f'vllm_router_policy_decisions_total{{policy="{self.policy}",worker="{w}"}} {self.processed[w]}'
            for w in self.workers
        ]
        if self.errors:  # as vllm-router, the series appears with its first error
            lines.append("# TYPE vllm_router_request_errors_total counter")
            lines += [
                f'vllm_router_request_errors_total{{route="{r}",error_type="worker_unreachable"}} {n}'
                for r, n in sorted(self.errors.items())
            ]
        lines.append("# TYPE vllm_router_worker_health gauge")
        lines += [f'vllm_router_worker_health{{worker="{w}"}} {int(self.healthy[w])}' for w in self.workers]
        lines.append("# TYPE vllm_router_active_workers gauge")
        lines.append(f"vllm_router_active_workers {sum(self.healthy.values())}")
        return "\n".join(lines) + "\n"
