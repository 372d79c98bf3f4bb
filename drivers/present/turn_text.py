"""A finished turn in words: the one-line summary the events panel and the headless output print, and the
TTFT's account in it. Written from the turn's row (drivers/model/turn_row.py), so the line says what the
report's table says."""

from __future__ import annotations

from rampwatch.drivers.model.log import LogEntry
from rampwatch.drivers.model.ttft_split import TtftSplit, turn_split
from rampwatch.drivers.model.turn_row import turn_row
from rampwatch.drivers.model.turns import TurnRecord

# The server flag that makes each engine time its own requests (llama.cpp always does).
ENGINE_TIMING_FLAGS = {
    "vllm": "vLLM: --enable-per-request-metrics",
    "sglang": "SGLang reports none per request",
}


def engine_timing_hint(engine: str | None) -> str:
    """One line for a run whose engine timed none of its turns: which server flag would give the figures."""
    flag = ENGINE_TIMING_FLAGS.get(engine or "", ENGINE_TIMING_FLAGS["vllm"])
    return f"engine's own queue and prefill time per turn unavailable ({flag}, or its OTLP spans to rampwatch --otlp)"


# Where the engine timed a turn but sent no span, the rest of its TTFT stays one figure: this says why.
REST_UNSPLIT = "the rest of each TTFT is not split into the server's front end and the client: that needs the engine's "
REST_UNSPLIT += "own TTFT, from its OTLP spans (rampwatch --otlp)"


def split_text(ttft: float, split: TtftSplit | None) -> str:
    """`TTFT 114.8s = queued 57.1 + prefill 57.2 + 0.5`, or with the engine's own TTFT `... + front end 0.48 +
    client 0.02`; a warning where the engine's figures exceed the client's."""
    head = f"TTFT {ttft:.2f}s"
    if split is None:
        return head
    queued = "" if split.queued_s is None else f"queued {split.queued_s:.2f} + "
    text = f"{head} = {queued}prefill {split.prefill_s:.2f}"
    if split.front_end_s is not None and split.client_s is not None:
        text += f" {_signed(split.front_end_s)} front end {abs(split.front_end_s):.2f}"
        text += f" {_signed(split.client_s)} client {abs(split.client_s):.3f}"
    else:
        text += f" {_signed(split.rest_s)} {abs(split.rest_s):.2f}"
    if split.contradicts:
        over = -min(split.rest_s, split.client_s if split.client_s is not None else split.rest_s)
        text += f" (engine exceeds TTFT by {over * 1000:.0f} ms: clocks or matching wrong)"
    return text


def _signed(value: float) -> str:
    return "-" if value < 0 else "+"


def spec_text(accepted: int | None, drafted: int | None, steps: int | None) -> str | None:
    """`spec 138/139 accepted, mean length 3.6`: speculative decoding's acceptance for one turn."""
    if accepted is None or not drafted:
        return None
    text = f"spec {accepted:,}/{drafted:,} accepted"
    return text + f", mean length {1 + accepted / steps:.2f}" if steps else text


def turn_line(rec: TurnRecord) -> str:
    """The one-line summary of a finished turn (headless output, events panel)."""
    row = turn_row(rec)
    parts = [f"{rec.session} turn {rec.turn}"]
    if rec.late and rec.send_lag is not None:
        parts.append(f"late {rec.send_lag * 1000:.0f} ms")
    if row.ttft_s is not None:
        parts.append(split_text(row.ttft_s, turn_split(rec)))
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
        ideal = row.ideal_cached_tokens
        of = (
            ""
            if ideal is None
            else f" of ideal {ideal:,}" + (f" ({row.cache_efficiency:.0%})" if row.cache_efficiency is not None else "")
        )
        parts.append(f"cached {row.cached_tokens:,}{of}")
    if row.transferred_tokens is not None:
        parts.append(f"transferred {row.transferred_tokens:,}")
    if row.prefill_leg_s is not None and row.transfer_s is not None:
        parts.append(f"prefill leg {row.prefill_leg_s:.2f}s + transfer {row.transfer_s:.2f}s")
    return "  ".join(parts)


def log_text(entry: LogEntry) -> str:
    """A log entry as a line: a finished turn's is its summary (after its lead-in, e.g. "span: ")."""
    return entry.text + turn_line(entry.turn) if entry.turn is not None else entry.text
