"""What a user adds to every chat request: body options (--extra-body) and headers (--header), with the
per-request placeholders a router's session affinity needs, and the rules that keep credentials out of sight."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keys rampwatch sets itself, and the flag that sets each (None: it is how rampwatch streams and measures).
RESERVED_BODY_KEYS: dict[str, str | None] = {
    "model": "--model",
    "messages": None,
    "prompt": None,
    "stream": None,
    "stream_options": None,
    "max_tokens": "--max-tokens",  # --output-tokens when it is not given
    "max_completion_tokens": "--max-tokens",
    "ignore_eos": "--ignore-eos",
    "min_tokens": "--ignore-eos",
    "temperature": None,
}
PLACEHOLDERS = ("session", "turn", "run")
# Headers rampwatch's own client writes to frame each request: a second copy would mis-frame it.
FRAMING_HEADERS = ("host", "content-length", "transfer-encoding", "connection", "content-type")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP header name (RFC 9110 token)
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# Header names whose values are credentials: never recorded, never printed.
_SECRET_HEADER = re.compile(r".*(?:auth|cookie|key|token|secret|passw).*", re.I)


def text_or_file(spec: str) -> str:
    """A flag's TEXT as given, or @FILE's text (UTF-8); ValueError says why a file cannot be read."""
    if not spec.startswith("@"):
        return spec
    try:
        return Path(spec[1:]).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{spec}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{spec}: not UTF-8 text") from None


def parse_extra_body(text: str) -> dict[str, Any]:
    """--extra-body JSON or @FILE -> the object merged into every request; ValueError says why not."""
    source = text_or_file(text)
    try:
        body = json.loads(source)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(body, dict):
        raise ValueError("must be a JSON object, e.g. '{\"top_k\": 20}'")
    for key in body:
        if key in RESERVED_BODY_KEYS:
            flag = RESERVED_BODY_KEYS[key]
            raise ValueError(f'"{key}" is set by rampwatch' + (f" (use {flag})" if flag else ""))
    return body


@dataclass(frozen=True)
class HeaderTemplate:
    """One --header: its value may name {session}, {turn} and {run}, filled in for each request."""

    name: str
    value: str

    @property
    def secret(self) -> bool:
        return is_secret_header(self.name)

    @property
    def per_request(self) -> bool:
        """Whether the value names a placeholder, so it is only known once a session's turn is sent."""
        return bool(_PLACEHOLDER.search(self.value))

    def expand(self, session: str, turn: int, run: str) -> str:
        return self.value.format(session=session, turn=turn, run=run)


def parse_header(spec: str) -> HeaderTemplate:
    """'NAME: VALUE' -> HeaderTemplate; ValueError says why not."""
    name, colon, value = spec.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not name:
        raise ValueError("use 'NAME: VALUE', e.g. 'x-session-id: {session}'")
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{name!r} is not a header name")
    if name.lower() in FRAMING_HEADERS:
        raise ValueError(f"{name} is set by rampwatch's own client for every request")
    if not all(c == "\t" or " " <= c <= "~" for c in value):
        raise ValueError("a header value must be printable ASCII (no line breaks, no other characters)")
    for field in _PLACEHOLDER.findall(value):
        if field not in PLACEHOLDERS:
            raise ValueError(f"{{{field}}} is not a placeholder (use {{session}}, {{turn}} or {{run}})")
    if any(c in _PLACEHOLDER.sub("", value) for c in "{}"):
        raise ValueError("unbalanced { } in the value (placeholders are {session}, {turn} and {run})")
    return HeaderTemplate(name, value)


def is_secret_header(name: str) -> bool:
    """Whether a header carries a credential by its name: its value is hidden wherever it is shown."""
    return bool(_SECRET_HEADER.fullmatch(name.strip()))


def request_headers(templates: list[HeaderTemplate], session: str, turn: int, run: str) -> dict[str, str]:
    """The per-request headers of one turn, placeholders filled in."""
    return {h.name: h.expand(session, turn, run) for h in templates if h.per_request}


def merge_headers(base: dict[str, str], over: dict[str, str]) -> dict[str, str]:
    """`base` with `over` on top, names compared case-insensitively (HTTP's rule), so an --header
    'authorization: ...' replaces the API key's Authorization instead of sending a second one."""
    replaced = {name.lower() for name in over}
    return {**{k: v for k, v in base.items() if k.lower() not in replaced}, **over}


def fixed_headers(templates: list[HeaderTemplate]) -> dict[str, str]:
    """The headers without placeholders: they go on every request to the inference servers."""
    return {h.name: h.value for h in templates if not h.per_request}
