"""One turn's record and every per-turn figure, defined once.

The fold (state.py) fills a TurnRecord from the events; the report's row (turn_row.py), the panels, the
exporter, the SLO verdict, goodput and the capacity point all read a turn's figures through the properties and
functions here, so no two of them can disagree on what "new tokens", "hit rate", "TTFT from due" or "TPOT" mean.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Literal

from rampwatch.drivers.model import events as ev

LATE_S = 0.010  # a turn sent more than this after its due time is late (coordinated omission)

TurnStatus = Literal["running", "ok", "failed", "cancelled"]


@dataclass(slots=True)
class TurnRecord:
    """Everything the events said about one attempt at one turn."""

    session: str
    turn: int
    target: int
    new_tokens_est: int
    sent_t: float
    attempt: int = 1
    prev_prompt_tokens: int | None = None  # the session's previous reported prompt, for "new tokens"
    prev_reply_tokens: int = 0  # the session's previous answer (re-sent in this prompt; a decode server holds it)
    first_t: float | None = None
    last_t: float | None = None
    chunks: int = 0
    status: TurnStatus = "running"
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int = 0
    needle: bool | None = None
    error: str | None = None
    done_t: float | None = None
    kv_peak: float | None = None
    engine_prefill_s: float | None = None  # the engine's own prefill (vLLM per-request metrics or span, llama.cpp)
    queued_s: float | None = None  # the engine's own queue time before it scheduled the request (vLLM)
    engine_ttft_s: float | None = None  # the engine's own TTFT, from the request's arrival (its span, --otlp)
    spec_accepted: int | None = None  # speculative decoding: draft tokens accepted, drafted, verify steps
    spec_drafted: int | None = None
    spec_steps: int | None = None
    think_s: float | None = None  # the user's pause before this turn (--think-time)
    answer_t: float | None = None  # the first answer (content) chunk; first_t when the reply did not reason first
    reasoning_reported: int | None = None  # the server's usage.completion_tokens_details.reasoning_tokens
    reasoning_chunks: int = 0  # chunks that carried reasoning and no answer
    finish_reason: str | None = None
    reply_chars: int = 0
    # The server's prefix-cache (queries, hits) counters when the turn was sent and done: a tuple, not a
    # dict, because a long run keeps every finished turn.
    cache_at_sent: tuple[float, float] | None = None
    cache_at_done: tuple[float, float] | None = None
    # A prefill/decode split's decode side: (KV transferred in, prompt tokens admitted, sample time) when the turn
    # was sent; then the KV transferred in for this turn, from those counters (state.py attributes it).
    transfer_at_sent: tuple[float, float, float] | None = None
    kv_transferred: int | None = None
    prefill_leg_s: float | None = None  # a split's front: how long its prefill server took with the request
    # Inter-token gaps (between text chunks' arrivals), split by whether another session was prefilling;
    # arrays of doubles: a long run keeps every finished turn's gaps for the report.
    gaps_alone: array[float] = field(default_factory=lambda: array("d"))
    gaps_during: array[float] = field(default_factory=lambda: array("d"))
    max_gap: float = 0.0
    client_busy: bool = False  # a stamp of this turn was taken while the driver's own loop ran late
    client_busy_own: bool = False  # ... and the driver's own work (not the machine waking it late) made it so
    engine_decode_s: float | None = None  # the engine's first to last token (per-request metrics or its span)
    engine_timing: str | None = None  # where queued/prefill/decode came from: "metrics" (the response) or "span"
    span: ev.EngineSpan | None = None  # the engine's trace span of this request (--otlp), once it arrived
    span_disagreement_s: float | None = None  # the span against the response's metrics: the largest difference
    due_t: float | None = None  # open loop: when the turn was due (RequestSent.due); None: due when sent
    late_s: float = LATE_S  # LATE_S in this record's time (a demo's modelled time runs faster than the client's)
    ideal_cached: int | None = None  # --trace: the prompt tokens its trace allowed a cache to hold (unbounded)
    ideal_cached_pool: int | None = None  # ... with an LRU pool of --trace-kv-tokens
    # The backend that served it and the source that said so (backends.py: span, counters or ambiguous; None: none
    # said); until its counters are read, each backend's (prompt tokens, requests, sample time) when it was sent.
    served_by: str | None = None
    served_by_source: str | None = None
    counters_at_sent: dict[str, tuple[float, float | None, float]] | None = None
    # Set by the fold once the turn's figures are final (state.py's settle): whether --warmup left it out of the
    # run's figures, and its --slo verdict (None: no SLO, or a turn of the one-shot baseline).
    in_warmup: bool = False
    slo_met: bool | None = None

    # -- times: from the send, and as the user waited them (from the due time where there is one) --------------

    @property
    def start_t(self) -> float:
        """Where the user's wait begins: the due time (open loop), else the send."""
        return self.due_t if self.due_t is not None else self.sent_t

    @property
    def end_t(self) -> float | None:
        """The reply's end, for a turn that finished ok."""
        return self.done_t if self.status == "ok" else None

    @property
    def ttft(self) -> float | None:
        """Request sent to the first chunk of generated text (reasoning or answer)."""
        return since(self.sent_t, self.first_t)

    @property
    def ttfa(self) -> float | None:
        """Time to the first answer token (the TTFT when nothing was reasoned first)."""
        return since(self.sent_t, self.answer_t)

    @property
    def e2e(self) -> float | None:
        return since(self.sent_t, self.end_t)

    @property
    def user_ttft(self) -> float | None:
        return since(self.start_t, self.first_t)

    @property
    def user_ttfa(self) -> float | None:
        return since(self.start_t, self.answer_t)

    @property
    def user_e2e(self) -> float | None:
        return since(self.start_t, self.end_t)

    @property
    def send_lag(self) -> float | None:
        """How long after its due time the client sent the turn (open loop; None: closed loop)."""
        return None if self.due_t is None else self.sent_t - self.due_t

    @property
    def late(self) -> bool:
        """The send lagged the due time by more than LATE_S of the client's time: latency from the send time hides
        that wait."""
        lag = self.send_lag
        return lag is not None and lag > self.late_s

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (last token - first token) / (tokens - 1)."""
        rate = decode_tok_s(self.tokens, self.first_t, self.last_t)
        return None if rate is None else 1.0 / rate

    def prefill_elapsed(self, now: float) -> float | None:
        """How long a prefill in flight has waited so far (None: its first token came)."""
        return max(0.0, now - self.sent_t) if self.first_t is None and self.status == "running" else None

    # -- tokens -----------------------------------------------------------------------------------------------

    @property
    def tokens(self) -> int:
        """Generated tokens: the server's usage when it reported them, else text chunks."""
        return self.completion_tokens or self.chunks

    @property
    def tokens_per_chunk(self) -> float:
        """How many tokens one streamed chunk carried on average (1 until usage says otherwise)."""
        return self.completion_tokens / self.chunks if self.completion_tokens and self.chunks else 1.0

    @property
    def reasoning_tokens(self) -> int:
        return reasoning_tokens(self.reasoning_reported, self.reasoning_chunks, self.completion_tokens, self.chunks)

    @property
    def answer_tokens(self) -> int:
        return max(0, self.tokens - self.reasoning_tokens)

    @property
    def no_answer(self) -> bool:
        """The reply was cut (the token cap) before any answer: nothing to find the needle in."""
        return no_answer(self.finish_reason, self.reply_chars)

    @property
    def context_tokens(self) -> int:
        """The prompt as the server counted it, else the turn's target."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.target

    @property
    def decode_rate(self) -> float | None:
        """Decode tokens/s over the whole reply (decode_tok_s)."""
        return decode_tok_s(self.tokens, self.first_t, self.last_t)


def since(start: float, t: float | None) -> float | None:
    """Seconds from `start` to `t` (None: `t` has not come)."""
    return None if t is None else t - start


def reasoning_tokens(reported: int | None, reasoning_chunks: int, completion_tokens: int, chunks: int) -> int:
    """A reply's reasoning tokens: the server's count where usage gives one, else its reasoning chunks
    scaled by the reply's tokens per chunk (1 where usage gives no completion tokens). A count below the
    reasoning chunks is an undercount (each chunk carried a token at least): vLLM counts only tokens between
    a generated <think> and </think>, so a chat template that opens the block in the prompt reports 0."""
    if reported is not None and reported >= reasoning_chunks:
        return reported
    if not reasoning_chunks:
        return 0
    per_chunk = completion_tokens / chunks if completion_tokens and chunks else 1.0
    return min(round(reasoning_chunks * per_chunk), completion_tokens or reasoning_chunks)


def no_answer(finish_reason: str | None, reply_chars: int) -> bool:
    """Cut at the token cap before any answer came (a reasoning model that spent its budget thinking)."""
    return finish_reason == "length" and reply_chars == 0


def decode_tok_s(tokens: float, first_t: float | None, last_t: float | None) -> float | None:
    """Decode tokens/s = tokens after the first / (last token time - first token time)."""
    if first_t is None or last_t is None or last_t <= first_t or tokens <= 1:
        return None
    return (tokens - 1) / (last_t - first_t)


def transferred_tokens(rec: TurnRecord) -> int | None:
    """KV a split's decode server received for this turn instead of finding it in its prefix cache (state.py
    attributes its transferred-in counter to turns); never more than usage's cached tokens, which count it.
    None outside a split."""
    moved = rec.kv_transferred
    if moved is None or rec.cached_tokens is None:
        return moved
    return min(moved, rec.cached_tokens)


def transfer_s(rec: TurnRecord) -> float | None:
    """TTFT less the split's prefill leg: the KV transfer, the decode server's first step and the hops between."""
    ttft = rec.ttft
    return None if ttft is None or rec.prefill_leg_s is None else max(0.0, ttft - rec.prefill_leg_s)


def reused_tokens(rec: TurnRecord) -> int | None:
    """Prompt tokens the prefix cache supplied: usage's cached tokens less the KV transferred (a split's decode
    server counts both as cached)."""
    if rec.cached_tokens is None:
        return None
    return rec.cached_tokens - (transferred_tokens(rec) or 0)


def new_tokens(rec: TurnRecord) -> int:
    """Tokens the server had to prefill: prompt - reused when usage says both;
    else prompt - the previous prompt; else the client's estimate."""
    prompt = rec.prompt_tokens
    reused = reused_tokens(rec)
    if prompt is not None and reused is not None:
        return prompt - reused
    if prompt is not None and rec.prev_prompt_tokens is not None:
        return prompt - rec.prev_prompt_tokens
    if prompt is not None and rec.turn == 1:
        return prompt
    return rec.new_tokens_est


def prefill_tok_s(rec: TurnRecord) -> float | None:
    """Prefill rate on the new tokens = (prompt - cached) / TTFT, once the server reported the prompt."""
    ttft = rec.ttft
    return new_tokens(rec) / ttft if ttft and rec.prompt_tokens is not None else None


def hit_rate(rec: TurnRecord) -> float | None:
    """The request's own prefix-cache share (reused / prompt) when the server reports it; else the
    server-wide prefix-cache hit rate over the turn (counter deltas). Transferred KV is never a hit. None for a
    turn that did not finish ok: the counters over a failed or cancelled turn say nothing of its own prompt."""
    if rec.status != "ok":
        return None
    reused = reused_tokens(rec)
    if reused is not None and rec.prompt_tokens:
        return reused / rec.prompt_tokens
    a, b = rec.cache_at_sent, rec.cache_at_done
    if a is None or b is None or b[0] - a[0] <= 0:
        return None
    return (b[1] - a[1]) / (b[0] - a[0])


def ideal_hit_rate(rec: TurnRecord) -> float | None:
    """--trace: the share of the prompt its trace allowed a cache to hold (the hit rate a perfect cache gives)."""
    if rec.ideal_cached is None or rec.status != "ok" or not rec.context_tokens:
        return None
    return min(1.0, rec.ideal_cached / rec.context_tokens)


def cache_efficiency(rec: TurnRecord, pool: bool = False) -> float | None:
    """--trace: the prompt tokens the server's prefix cache supplied over those the trace allowed (measured /
    ideal; `pool`: the ideal of an LRU pool of --trace-kv-tokens). None where the ideal is unknown or zero."""
    ideal = rec.ideal_cached_pool if pool else rec.ideal_cached
    reused = reused_tokens(rec)
    return reused / ideal if ideal and reused is not None and rec.status == "ok" else None
