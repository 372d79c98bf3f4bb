"""Errors as OpenAI-compatible servers answer them, shared by the simulated
engine, its auth check and the prefill/decode proxy."""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_response(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status
    )
