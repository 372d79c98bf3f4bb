"""The reasoning switches: what --reasoning sends in the request body for the chat templates to read."""

from __future__ import annotations

from typing import Any

REASONING_MODES = ("auto", "on", "off")

# The chat-template switches that turn thinking on or off: Qwen3's templates (and vLLM's docs for them)
# read enable_thinking; DeepSeek V3.1's and GLM's read thinking. A template ignores the ones it does not know.
SWITCHES = ("enable_thinking", "thinking")


def reasoning_switches(mode: str) -> dict[str, Any]:
    """The request-body options for --reasoning MODE: nothing for auto (the server's default)."""
    if mode == "auto":
        return {}
    if mode not in REASONING_MODES:
        raise ValueError(f"not a reasoning mode: {mode!r} (use off, on or auto)")
    return {"chat_template_kwargs": dict.fromkeys(SWITCHES, mode == "on")}


def with_reasoning(extra_body: dict[str, Any], mode: str) -> dict[str, Any]:
    """`extra_body` (--extra-body) with the switches of `mode` added: the user's own chat_template_kwargs keys
    win over the switches, and the rest of the user's body is kept as it is."""
    switches = reasoning_switches(mode)
    if not switches:
        return extra_body
    kwargs = {**switches["chat_template_kwargs"], **(extra_body.get("chat_template_kwargs") or {})}
    return {**extra_body, "chat_template_kwargs": kwargs}
