"""The simulated engine's API-key check, as vLLM's --api-key does it."""

from __future__ import annotations

from typing import Any

from rampwatch.drivers.sim.errors import error_response

GUARDED_PREFIX = "/v1"  # as vLLM: /metrics, /health and /tokenize answer without the key


class RequireKey:
    """ASGI middleware: every request under /v1 needs `Authorization: Bearer <key>`."""

    def __init__(self, app: Any, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        guarded = scope["type"] == "http" and scope["path"].startswith(GUARDED_PREFIX)
        if guarded and dict(scope["headers"]).get(b"authorization") != self.expected:
            await error_response(401, "invalid or missing API key", "AuthenticationError")(scope, receive, send)
            return
        await self.app(scope, receive, send)
