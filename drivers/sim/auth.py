"""The simulated engine's API-key check, as vLLM's --api-key does it."""

from __future__ import annotations

from typing import Any

from rampwatch.drivers.sim.errors import error_response


class RequireKey:
    """ASGI middleware: every request but /health needs `Authorization: Bearer <key>`."""

    def __init__(self, app: Any, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await error_response(401, "invalid or missing API key", "AuthenticationError")(scope, receive, send)
            return
        await self.app(scope, receive, send)
