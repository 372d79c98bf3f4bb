"""The ids every chat request carries so the engine's own record of it can be joined to its turn: an
`X-Request-Id` (vLLM makes it the request id) and a W3C `traceparent` naming the turn's own trace."""

from __future__ import annotations

import hashlib

REQUEST_ID_HEADER = "X-Request-Id"


def request_id(run: str, session: str, turn: int, attempt: int) -> str:
    """`<run>-<session>-t<turn>-a<attempt>`: unique per attempt, readable, and derivable from a recording."""
    return f"{run}-{session}-t{turn}-a{attempt}"


def _hex_id(text: str, digits: int) -> str:
    """`digits` hex digits derived from `text`; never all zeros (W3C forbids an all-zero id)."""
    h = hashlib.sha256(text.encode()).hexdigest()[:digits]
    return h if h.strip("0") else "1".rjust(digits, "0")


def trace_id(run: str, session: str, turn: int) -> str:
    """The turn's trace: every attempt at one turn shares it."""
    return _hex_id(f"{run}-{session}-t{turn}", 32)


def span_id(run: str, session: str, turn: int, attempt: int) -> str:
    """The attempt's own span: the engine's span is its child."""
    return _hex_id(request_id(run, session, turn, attempt), 16)


def traceparent(run: str, session: str, turn: int, attempt: int) -> str:
    """W3C Trace Context `traceparent`: version 00, sampled (flags 01)."""
    return f"00-{trace_id(run, session, turn)}-{span_id(run, session, turn, attempt)}-01"


def has_header(headers: dict[str, str], name: str) -> str | None:
    """The value of header `name` (case-insensitive) in `headers`, or None."""
    low = name.lower()
    return next((v for k, v in headers.items() if k.lower() == low), None)


def id_headers(headers: dict[str, str], run: str, session: str, turn: int, attempt: int) -> tuple[dict[str, str], str]:
    """(the headers to add to this attempt, its request id): the user's own X-Request-Id (--header) wins and is
    what the engine will know the request by; a traceparent the user set is kept likewise."""
    added: dict[str, str] = {}
    rid = has_header(headers, REQUEST_ID_HEADER)
    if rid is None:
        rid = added[REQUEST_ID_HEADER] = request_id(run, session, turn, attempt)
    if has_header(headers, "traceparent") is None:
        added["traceparent"] = traceparent(run, session, turn, attempt)
    return added, rid
