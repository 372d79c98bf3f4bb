"""One turn's record and the figures derived from it, defined once.

The live state (state.py) and the report (analysis.py) both read a turn
through these functions, so the events panel, the headless lines and
`rampwatch report` can never disagree on what "new tokens", "hit rate" or
"decode tokens/s" mean. (Just over ~400 lines: the record, its row and every
per-turn figure's definition, kept in one place on purpose.)
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.stats import quantile

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
    server_prefill_s: float | None = None  # the engine's own prefill (vLLM per-request metrics, llama.cpp timings)
    queued_s: float | None = None  # the engine's own queue time before it scheduled the request (vLLM)
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

    @property
    def ttft(self) -> float | None:
        return None if self.first_t is None else self.first_t - self.sent_t

    @property
    def send_lag(self) -> float | None:
        """How long after its due time the client sent the turn (open loop; None: closed loop)."""
        return None if self.due_t is None else self.sent_t - self.due_t

    @property
    def late(self) -> bool:
        """The send lagged the due time by more than LATE_S: latency from the send time hides that wait."""
        lag = self.send_lag
        return lag is not None and lag > LATE_S

    @property
    def ttfa(self) -> float | None:
        """Time to the first answer token (the TTFT when nothing was reasoned first)."""
        return None if self.answer_t is None else self.answer_t - self.sent_t

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
    def tokens(self) -> int:
        """Generated tokens: the server's usage when it reported them, else text chunks."""
        return self.completion_tokens or self.chunks

    @property
    def tokens_per_chunk(self) -> float:
        """How many tokens one streamed chunk carried on average (1 until usage says otherwise)."""
        return self.completion_tokens / self.chunks if self.completion_tokens and self.chunks else 1.0


CLOCK_TOLERANCE_S = 0.005  # the engine's figures may exceed the client's TTFT by this much before it is an error


@dataclass(frozen=True, slots=True)
class TtftSplit:
    """The client's TTFT as the engine accounts for it: queued (None: the engine does not say, llama.cpp) +
    the engine's prefill + the rest (client, network, HTTP, template, tokenizer)."""

    queued_s: float | None
    prefill_s: float
    rest_s: float

    @property
    def contradicts(self) -> bool:
        """The engine's figures exceed the client's TTFT beyond clock tolerance: clocks or matching are wrong."""
        return self.rest_s < -CLOCK_TOLERANCE_S


# The server flag that makes each engine time its own requests (llama.cpp always does).
ENGINE_TIMING_FLAGS = {
    "vllm": "vLLM: --enable-per-request-metrics",
    "sglang": "SGLang reports none per request",
}


def engine_timing_hint(engine: str | None) -> str:
    """One line for a run whose engine timed none of its turns: which server flag would give the figures."""
    flag = ENGINE_TIMING_FLAGS.get(engine or "", ENGINE_TIMING_FLAGS["vllm"])
    return f"engine's own queue and prefill time per turn unavailable ({flag}, or its OTLP spans to rampwatch --otlp)"


def ttft_split(ttft: float | None, queued_s: float | None, prefill_s: float | None) -> TtftSplit | None:
    """TTFT = queued + engine prefill + rest, where the engine gave its prefill time; else None."""
    if ttft is None or prefill_s is None:
        return None
    return TtftSplit(queued_s, prefill_s, ttft - (queued_s or 0.0) - prefill_s)


WaitPart = Literal["rest", "queued", "prefill"]


def wait_parts(
    sent_t: float, first_t: float | None, queued_s: float | None, prefill_s: float | None
) -> list[tuple[WaitPart, float, float]] | None:
    """A turn's wait, request sent to first token, as the engine accounts for it, for drawing: the rest
    (client, HTTP, tokenizer) first, then queued, then the engine's prefill ending at the first token; each
    (part, start, end), empty parts left out, clipped to the wait where the engine's figures exceed it.
    None without the engine's prefill figure (drawn as one wait, as before)."""
    split = ttft_split(None if first_t is None else first_t - sent_t, queued_s, prefill_s)
    if split is None or first_t is None:
        return None
    prefill_start = max(sent_t, first_t - split.prefill_s)
    queued_start = max(sent_t, prefill_start - (split.queued_s or 0.0))
    parts: list[tuple[WaitPart, float, float]] = [
        ("rest", sent_t, queued_start),
        ("queued", queued_start, prefill_start),
        ("prefill", prefill_start, first_t),
    ]
    return [p for p in parts if p[2] > p[1]]


def split_text(ttft: float, split: TtftSplit | None) -> str:
    """`TTFT 114.8s = queued 57.1 + prefill 57.2 + 0.5`, with a warning where the rest is negative."""
    head = f"TTFT {ttft:.2f}s"
    if split is None:
        return head
    queued = "" if split.queued_s is None else f"queued {split.queued_s:.2f} + "
    sign = "-" if split.rest_s < 0 else "+"
    text = f"{head} = {queued}prefill {split.prefill_s:.2f} {sign} {abs(split.rest_s):.2f}"
    if split.contradicts:
        text += f" (engine exceeds TTFT by {-split.rest_s * 1000:.0f} ms: clocks or matching wrong)"
    return text


def spec_text(accepted: int | None, drafted: int | None, steps: int | None) -> str | None:
    """`spec 138/139 accepted, mean length 3.6`: speculative decoding's acceptance for one turn."""
    if accepted is None or not drafted:
        return None
    text = f"spec {accepted:,}/{drafted:,} accepted"
    return text + f", mean length {1 + accepted / steps:.2f}" if steps else text


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
    server-wide prefix-cache hit rate over the turn (counter deltas). Transferred KV is never a hit."""
    reused = reused_tokens(rec)
    if reused is not None and rec.prompt_tokens:
        return reused / rec.prompt_tokens
    a, b = rec.cache_at_sent, rec.cache_at_done
    if a is None or b is None or b[0] - a[0] <= 0:
        return None
    return (b[1] - a[1]) / (b[0] - a[0])


def split_decode_rates(rec: TurnRecord, min_intervals: int) -> tuple[float | None, float | None]:
    """(decode tok/s alone, during another session's prefill) for one turn, in
    tokens (chunk intervals scaled by the turn's tokens per chunk)."""
    scale = rec.tokens_per_chunk

    def rate(gaps: array[float]) -> float | None:
        dt = sum(gaps)
        return len(gaps) * scale / dt if len(gaps) >= min_intervals and dt > 0 else None

    return rate(rec.gaps_alone), rate(rec.gaps_during)


STALL_S = 0.1  # a gap longer than this is a stall worth showing live
LONG_STALL_S = 1.0


class GapStats(msgspec.Struct):
    """Inter-token gaps: the waits between deliveries of generated text, as a
    reader of the stream saw them (not engine steps). A chunk can carry
    several tokens, and chunks that arrive in one network read share a
    stamp: they are one delivery, so their zero gaps are not counted here
    (the decode rates still count every chunk)."""

    count: int
    p50_s: float
    p99_s: float
    max_s: float
    over_100ms: int
    over_1s: int


def is_delivery_gap(dt: float) -> bool:
    """Whether a gap between two text chunks' stamps was a wait: chunks stamped in one network read (a zero gap)
    are one delivery. The report's gap figures and the exporter's gap histogram both count by this rule."""
    return dt > 0


def gap_stats(gaps: Iterable[float]) -> GapStats | None:
    ordered = sorted(g for g in gaps if is_delivery_gap(g))
    if not ordered:
        return None
    return GapStats(
        count=len(ordered),
        p50_s=quantile(ordered, 0.5),
        p99_s=quantile(ordered, 0.99),
        max_s=ordered[-1],
        over_100ms=sum(1 for g in ordered if g > STALL_S),
        over_1s=sum(1 for g in ordered if g > LONG_STALL_S),
    )


class TurnRow(msgspec.Struct):
    """One row of the per-turn table (the report's JSON schema)."""

    turn: int
    context_tokens: int
    new_tokens: int
    cached_tokens: int | None
    ttft_s: float | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    output_tokens: int
    hit_rate: float | None
    kv_peak: float | None
    needle: bool | None
    error: str | None
    gap_p50_s: float | None
    gap_p99_s: float | None
    gap_max_s: float | None
    gaps_over_100ms: int
    gaps_over_1s: int
    server_prefill_s: float | None  # = engine_prefill_s; the name schema 3 gave it (llama.cpp only then)
    client_busy: bool  # a stamp of this turn was taken while the driver's loop ran over 5 ms late
    client_busy_own: bool  # ... by the driver's own work (false: only the machine waking it late)
    ttfa_s: float | None  # time to the first answer token (= ttft_s when nothing was reasoned first)
    reasoning_tokens: int  # of output_tokens, those spent reasoning
    answer_tokens: int  # output_tokens - reasoning_tokens
    no_answer: bool  # cut at the token cap before any answer: the needle was not answered (needle is null)
    think_s: float | None = None  # the user's pause before the turn (--think-time)
    engine_prefill_s: float | None = None  # the engine's prefill (vLLM: scheduled to first token; llama.cpp: prompt)
    queued_s: float | None = None  # the engine's queue time (vLLM --enable-per-request-metrics)
    ttft_rest_s: float | None = None  # ttft_s - queued_s - engine_prefill_s: client, network, HTTP, tokenizer
    spec_accepted: int | None = None  # speculative decoding: draft tokens accepted ...
    spec_drafted: int | None = None  # ... of those drafted
    # A prefill/decode split: KV the decode server received from the prefill server (not in cached_tokens,
    # which counts prefix-cache reuse only); where the split's front says how long its prefill leg took, the
    # rest of the TTFT: the KV transfer and the decode server's first step.
    transferred_tokens: int | None = None
    prefill_leg_s: float | None = None
    transfer_s: float | None = None
    engine_decode_s: float | None = None  # the engine's first to last token
    engine_timing: str | None = None  # where the engine's figures came from: "metrics" (the response) or "span"
    span_disagreement_s: float | None = None  # the OTLP span against the response's metrics (both present)
    # Open loop (--arrivals): the run times when the turn was due and sent, the lag between, whether it was late
    # (> 10 ms), and TTFT and end-to-end measured from the due time as well as from the send time.
    due_s: float | None = None
    sent_s: float | None = None
    send_lag_s: float | None = None
    late: bool | None = None
    ttft_from_due_s: float | None = None
    e2e_s: float | None = None
    e2e_from_due_s: float | None = None
    slo_met: bool | None = None  # --slo: the turn met every named bound (None: no SLO given)


def turn_row(rec: TurnRecord) -> TurnRow:
    gaps = gap_stats(rec.gaps_alone + rec.gaps_during)
    split = ttft_split(rec.ttft, rec.queued_s, rec.server_prefill_s)
    return TurnRow(
        turn=rec.turn,
        context_tokens=rec.prompt_tokens if rec.prompt_tokens is not None else rec.target,
        new_tokens=new_tokens(rec),
        cached_tokens=reused_tokens(rec),
        transferred_tokens=transferred_tokens(rec),
        prefill_leg_s=rec.prefill_leg_s,
        transfer_s=transfer_s(rec),
        ttft_s=rec.ttft,
        prefill_tok_s=prefill_tok_s(rec),
        decode_tok_s=decode_tok_s(rec.tokens, rec.first_t, rec.last_t),
        output_tokens=rec.tokens,
        hit_rate=hit_rate(rec),
        kv_peak=rec.kv_peak,
        needle=rec.needle,
        error=rec.error if rec.status != "ok" else None,
        gap_p50_s=gaps.p50_s if gaps else None,
        gap_p99_s=gaps.p99_s if gaps else None,
        gap_max_s=gaps.max_s if gaps else None,
        gaps_over_100ms=gaps.over_100ms if gaps else 0,
        gaps_over_1s=gaps.over_1s if gaps else 0,
        server_prefill_s=rec.server_prefill_s,
        engine_prefill_s=rec.server_prefill_s,
        queued_s=rec.queued_s,
        ttft_rest_s=split.rest_s if split else None,
        spec_accepted=rec.spec_accepted,
        spec_drafted=rec.spec_drafted,
        client_busy=rec.client_busy,
        client_busy_own=rec.client_busy_own,
        think_s=rec.think_s,
        ttfa_s=rec.ttfa,
        reasoning_tokens=rec.reasoning_tokens,
        answer_tokens=rec.answer_tokens,
        no_answer=rec.no_answer,
        engine_decode_s=rec.engine_decode_s,
        engine_timing=rec.engine_timing,
        span_disagreement_s=rec.span_disagreement_s,
        **open_loop_figures(rec),
    )


def open_loop_figures(rec: TurnRecord) -> dict[str, float | bool | None]:
    """A turn's due and send times and the latencies from each; a closed-loop turn (no due time) only has
    its send time and end-to-end latency."""
    e2e = None if rec.done_t is None or rec.status != "ok" else rec.done_t - rec.sent_t
    due = rec.due_t
    return dict(
        due_s=due,
        sent_s=rec.sent_t,
        send_lag_s=rec.send_lag,
        late=rec.late if due is not None else None,
        ttft_from_due_s=None if due is None or rec.first_t is None else rec.first_t - due,
        e2e_s=e2e,
        e2e_from_due_s=None if due is None or e2e is None else e2e + rec.sent_t - due,
    )


def turn_line(rec: TurnRecord) -> str:
    """The one-line summary of a finished turn (headless output, events panel)."""
    row = turn_row(rec)
    parts = [f"{rec.session} turn {rec.turn}"]
    if rec.late and rec.send_lag is not None:
        parts.append(f"late {rec.send_lag * 1000:.0f} ms")
    if row.ttft_s is not None:
        parts.append(split_text(row.ttft_s, ttft_split(row.ttft_s, row.queued_s, row.engine_prefill_s)))
    if row.reasoning_tokens:
        parts.append(f"reasoning {row.reasoning_tokens:,} tok")
        if row.ttfa_s is not None:
            parts.append(f"answer {row.ttfa_s:.2f}s")
    if row.decode_tok_s is not None:
        parts.append(f"decode {row.decode_tok_s:.1f} tok/s")
    if row.gap_max_s is not None:
        parts.append(f"max gap {row.gap_max_s:.2f}s")
    spec = spec_text(rec.spec_accepted, rec.spec_drafted, rec.spec_steps)
    if spec:
        parts.append(spec)
    if row.no_answer:
        parts.append("needle: no answer")
    elif row.needle is not None:
        parts.append("needle ✓" if row.needle else "needle ✗")
    parts.append(f"ctx {row.context_tokens:,}")
    if row.cached_tokens is not None:
        parts.append(f"cached {row.cached_tokens:,}")
    if row.transferred_tokens is not None:
        parts.append(f"transferred {row.transferred_tokens:,}")
    if row.prefill_leg_s is not None and row.transfer_s is not None:
        parts.append(f"prefill leg {row.prefill_leg_s:.2f}s + transfer {row.transfer_s:.2f}s")
    return "  ".join(parts)
