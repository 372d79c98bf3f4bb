"""One row of the per-turn table: the report's JSON schema for a turn, read off its record (turns.py) and
nothing else, so a row says exactly what the panels, the exporter and the SLO verdict read."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.model.gaps import turn_gaps
from rampwatch.drivers.model.ttft_split import turn_split
from rampwatch.drivers.model.turns import (
    TurnRecord,
    cache_efficiency,
    hit_rate,
    new_tokens,
    prefill_tok_s,
    reused_tokens,
    transfer_s,
    transferred_tokens,
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
    client_busy: bool  # a stamp of this turn was taken while the driver's loop ran over 5 ms late
    client_busy_own: bool  # ... by the driver's own work (false: only the machine waking it late)
    ttfa_s: float | None  # time to the first answer token (= ttft_s when nothing was reasoned first)
    reasoning_tokens: int  # of output_tokens, those spent reasoning
    answer_tokens: int  # output_tokens - reasoning_tokens
    no_answer: bool  # cut at the token cap before any answer: the needle was not answered (needle is null)
    think_s: float | None = None  # the user's pause before the turn (--think-time)
    engine_prefill_s: float | None = None  # the engine's prefill (vLLM: scheduled to first token; llama.cpp: prompt)
    queued_s: float | None = None  # the engine's queue time (vLLM --enable-per-request-metrics, or its span)
    ttft_rest_s: float | None = None  # ttft_s - queued_s - engine_prefill_s: front end and client together
    engine_ttft_s: float | None = None  # the engine's own TTFT from the request's arrival (its span, --otlp)
    ttft_front_end_s: float | None = None  # engine_ttft_s - queued_s - engine_prefill_s: template, tokenizer, ...
    ttft_client_s: float | None = None  # ttft_s - engine_ttft_s: the network, the HTTP server, the client
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
    tpot_s: float | None = None  # time per output token after the first (1 / decode_tok_s)
    # Open loop (--arrivals): the run times when the turn was due and sent, the lag between, whether it was late
    # (> 10 ms), and TTFT, TTFA and end-to-end measured from the due time as well as from the send time.
    due_s: float | None = None
    sent_s: float | None = None
    send_lag_s: float | None = None
    late: bool | None = None
    ttft_from_due_s: float | None = None
    ttfa_from_due_s: float | None = None
    e2e_s: float | None = None
    e2e_from_due_s: float | None = None
    slo_met: bool | None = None  # --slo: the turn met every named bound (None: no SLO given)
    # --trace: the prompt tokens the trace's blocks allowed a prefix cache to hold (unbounded; an LRU pool of
    # --trace-kv-tokens), and cached_tokens over each (None: not a trace run, or the ideal was 0).
    ideal_cached_tokens: int | None = None
    ideal_cached_pool_tokens: int | None = None
    cache_efficiency: float | None = None
    cache_efficiency_pool: float | None = None
    # The backend that served the turn and the source that said so: span (its OTLP span's resource), counters (the
    # backends' own), or ambiguous (overlapping turns moved several; served_by null). None: nothing said.
    served_by: str | None = None
    served_by_source: str | None = None


def turn_row(rec: TurnRecord) -> TurnRow:
    gaps = turn_gaps(rec)
    split = turn_split(rec)
    due = rec.due_t is not None
    return TurnRow(
        turn=rec.turn,
        context_tokens=rec.context_tokens,
        new_tokens=new_tokens(rec),
        cached_tokens=reused_tokens(rec),
        transferred_tokens=transferred_tokens(rec),
        prefill_leg_s=rec.prefill_leg_s,
        transfer_s=transfer_s(rec),
        ttft_s=rec.ttft,
        prefill_tok_s=prefill_tok_s(rec),
        decode_tok_s=rec.decode_rate,
        tpot_s=rec.tpot,
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
        engine_prefill_s=rec.engine_prefill_s,
        queued_s=rec.queued_s,
        ttft_rest_s=split.rest_s if split else None,
        engine_ttft_s=rec.engine_ttft_s,
        ttft_front_end_s=split.front_end_s if split else None,
        ttft_client_s=split.client_s if split else None,
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
        due_s=rec.due_t,
        sent_s=rec.sent_t,
        send_lag_s=rec.send_lag,
        late=rec.late if due else None,
        ttft_from_due_s=rec.user_ttft if due else None,
        ttfa_from_due_s=rec.user_ttfa if due else None,
        e2e_s=rec.e2e,
        e2e_from_due_s=rec.user_e2e if due else None,
        slo_met=rec.slo_met,
        ideal_cached_tokens=rec.ideal_cached,
        ideal_cached_pool_tokens=rec.ideal_cached_pool,
        cache_efficiency=cache_efficiency(rec),
        cache_efficiency_pool=cache_efficiency(rec, pool=True),
        served_by=rec.served_by,
        served_by_source=rec.served_by_source,
    )
