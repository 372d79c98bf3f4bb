"""Simulated engine profiles: scheduler sizes and a step cost model.

A step's time is: overhead + per prefill token (a + b * its context position)
+ per decode token (d + e * its context), divided by the time scale.
`glm-like` is calibrated to published single-node figures of a large model
on 8 GPUs: ~1,650 tokens/s prefill at depth (131K new tokens in 79-88 s at
262K-917K context), a fresh 1M prompt in ~628 s, and 34.7 tokens/s decode
for one session at 1M context. Its step budget is 512 tokens, so a session
decoding beside another's long prefill gets ~3 tokens/s (one per step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class SimProfile:
    name: str
    max_model_len: int
    kv_tokens: int  # KV pool size in tokens
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    step_overhead_s: float
    prefill_token_s: float  # a: per prefill token
    prefill_attn_s: float  # b: per prefill token per token of context before it
    decode_token_s: float  # d: per decode token
    decode_attn_s: float  # e: per decode token per token of context
    time_scale: float = 1.0  # 20 = twenty times faster than the modelled engine
    chars_per_token: int = 4  # the deterministic tokenizer: every 4 bytes are a token
    burst: int = 1  # SSE events written together (the 'fast' profile batches writes)
    kv_transfer_token_s: float = 2e-6  # prefill/decode split: seconds to move one token's KV between nodes
    # The server's front end before the queue (the chat template and the tokenizer), per prompt token: vLLM's API
    # server does this in Python before the engine sees the request, seconds for a 1M-token prompt.
    front_end_token_s: float = 0.0

    def front_end_time(self, tokens: int) -> float:
        """Seconds the front end takes with a prompt of `tokens` tokens before it joins the queue."""
        return tokens * self.front_end_token_s / self.time_scale

    def transfer_time(self, tokens: int) -> float:
        """Seconds to move `tokens` tokens of KV from the prefill node to the decode node."""
        return tokens * self.kv_transfer_token_s / self.time_scale

    def step_time(self, prefill: list[tuple[int, int]], decode_contexts: list[int]) -> float:
        """Seconds for one step: `prefill` holds (start position, tokens) chunks,
        `decode_contexts` the context length of each decoding sequence."""
        t = self.step_overhead_s if (prefill or decode_contexts) else 0.0
        for start, n in prefill:
            t += n * (self.prefill_token_s + self.prefill_attn_s * (start + n / 2))
        if decode_contexts:
            t += len(decode_contexts) * self.decode_token_s + self.decode_attn_s * sum(decode_contexts)
        return t / self.time_scale

    def scaled(self, **changes: object) -> SimProfile:
        return replace(self, **changes)  # type: ignore[arg-type]


# One line each for a profile's sizes, its scheduler and its step cost (a table: kept out of the formatter).
# fmt: off
PROFILES: dict[str, SimProfile] = {
    # Small and quick, for tests: a 32K ramp of two sessions in a few seconds.
    "tiny": SimProfile(
        name="tiny", max_model_len=40_960, kv_tokens=262_144, block_size=16,
        max_num_batched_tokens=1024, max_num_seqs=64,
        step_overhead_s=0.002, prefill_token_s=8e-6, prefill_attn_s=2e-10, decode_token_s=0.0005, decode_attn_s=2e-8,
    ),
    # No modelled cost at all: streams as fast as the process can, for client benchmarks.
    "fast": SimProfile(
        name="fast", max_model_len=1_048_576, kv_tokens=8_388_608, block_size=64,
        max_num_batched_tokens=65_536, max_num_seqs=1024, burst=8,
        step_overhead_s=0.0, prefill_token_s=0.0, prefill_attn_s=0.0, decode_token_s=0.0, decode_attn_s=0.0,
    ),
    # A large model on one 8-GPU node, in real time (use time_scale to speed up). Its KV pool is the seed's:
    # 92,565 blocks of 64 tokens, so one 1M-token session holds 17.7% of it and two 35.4%.
    "glm-like": SimProfile(
        name="glm-like", max_model_len=1_048_576, kv_tokens=5_924_160, block_size=64,
        max_num_batched_tokens=512, max_num_seqs=256, time_scale=1.0,
        step_overhead_s=0.018, prefill_token_s=546.6e-6, prefill_attn_s=1.1e-10, decode_token_s=0.0005,
        decode_attn_s=1.03e-8,
        kv_transfer_token_s=7.5e-6,  # ~376 KB of KV a token over a 50 GB/s link
        front_end_token_s=2e-6,  # template and tokenizer: 2 s for a 1M-token prompt
    ),
}
# fmt: on


def make_profile(name: str, **overrides: Any) -> SimProfile:
    """Profile `name` with the given fields changed; an override of None keeps the profile's value."""
    base = PROFILES[name]
    return base.scaled(**{k: v for k, v in overrides.items() if v is not None})
