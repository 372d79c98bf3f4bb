"""A turn's TTFT as the engine accounts for it: queued + the engine's prefill + the rest, and, where the engine's
own TTFT is known (its span), the rest split into the server's front end and the client's side.

    client TTFT = queued + engine prefill + rest
    rest        = front end (engine TTFT - queued - prefill: template, tokenizer, hand-offs inside the server)
                + client    (client TTFT - engine TTFT: network, the HTTP server, the client's own read)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rampwatch.drivers.model.turns import TurnRecord

CLOCK_TOLERANCE_S = 0.005  # the engine's figures may exceed the client's TTFT by this much before it is an error


@dataclass(frozen=True, slots=True)
class TtftSplit:
    """The client's TTFT as the engine accounts for it (queued None: the engine does not say, llama.cpp)."""

    queued_s: float | None
    prefill_s: float
    rest_s: float
    front_end_s: float | None = None  # the rest inside the server (None: no engine TTFT, so the rest stays whole)
    client_s: float | None = None  # the rest outside it: the network, the HTTP server, the client

    @property
    def contradicts(self) -> bool:
        """The engine's figures exceed the client's TTFT beyond clock tolerance: clocks or matching are wrong."""
        return self.rest_s < -CLOCK_TOLERANCE_S or (self.client_s is not None and self.client_s < -CLOCK_TOLERANCE_S)


def ttft_split(
    ttft: float | None, queued_s: float | None, prefill_s: float | None, engine_ttft_s: float | None = None
) -> TtftSplit | None:
    """TTFT = queued + engine prefill + rest, where the engine gave its prefill time; else None. With the engine's
    own TTFT the rest splits into front end and client."""
    if ttft is None or prefill_s is None:
        return None
    rest = ttft - (queued_s or 0.0) - prefill_s
    if engine_ttft_s is None:
        return TtftSplit(queued_s, prefill_s, rest)
    client = ttft - engine_ttft_s
    return TtftSplit(queued_s, prefill_s, rest, front_end_s=rest - client, client_s=client)


def turn_split(rec: TurnRecord) -> TtftSplit | None:
    """The split of a turn's TTFT from its record."""
    return ttft_split(rec.ttft, rec.queued_s, rec.engine_prefill_s, rec.engine_ttft_s)


# The parts of a timed wait, in the order they are drawn from the send: the rest (one part, or the client's side
# then the server's front end), then queued, then the engine's prefill ending at the first token.
WaitPart = Literal["rest", "client", "front end", "queued", "prefill"]


def wait_parts(rec: TurnRecord) -> list[tuple[WaitPart, float, float]] | None:
    """A turn's wait, request sent to first token, as the engine accounts for it, for drawing: each (part, start,
    end), empty parts left out, clipped to the wait where the engine's figures exceed it. None without the
    engine's prefill figure (drawn as one wait). The front end is drawn in one piece before the queue, though
    part of it (the first token's way out) comes after the prefill."""
    split = turn_split(rec)
    first_t, sent_t = rec.first_t, rec.sent_t
    if split is None or first_t is None:
        return None
    prefill_start = max(sent_t, first_t - split.prefill_s)
    queued_start = max(sent_t, prefill_start - (split.queued_s or 0.0))
    parts: list[tuple[WaitPart, float, float]]
    if split.client_s is None:
        parts = [("rest", sent_t, queued_start)]
    else:
        client_end = min(queued_start, sent_t + max(0.0, split.client_s))
        parts = [("client", sent_t, client_end), ("front end", client_end, queued_start)]
    parts += [("queued", queued_start, prefill_start), ("prefill", prefill_start, first_t)]
    return [p for p in parts if p[2] > p[1]]
