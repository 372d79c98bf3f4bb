"""Joining the engine's trace spans (--otlp) to turns: by the request id each turn's request carried.

A span arrives after its request ended, often after the turn's TurnDone, so a late span settles a finished turn.
Where the response's own per-request metrics already timed the turn, they win (they came with the turn itself,
no join needed) and the span only checks them: the largest disagreement is kept. Where they did not, the span's
figures fill the same fields (queued, engine prefill, engine decode) and the turn says they came from the span.
The engine's own TTFT (from the request's arrival) comes only from the span: it splits the rest of the client's
TTFT into the server's front end and the client's side (ttft_split.py).
A span that matches no turn of this run (another client's request, an older run) is counted, never dropped.
"""

from __future__ import annotations

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.turns import TurnRecord


class SpanLedger:
    """The turns by request id, and what the spans said: matched, unmatched, receiver errors, agreement."""

    def __init__(self) -> None:
        self.by_request_id: dict[str, TurnRecord] = {}
        self.matched = 0
        self.unmatched = 0
        self.errors = 0
        self.last_error: str | None = None
        self.max_disagreement_s: float | None = None  # spans vs per-request metrics, over the turns with both

    def sent(self, rec: TurnRecord, request_id: str) -> None:
        if request_id:
            self.by_request_id[request_id] = rec

    def arrived(self, e: ev.EngineSpan) -> TurnRecord | None:
        """The turn this span belongs to (None: unmatched, counted); a finished turn is settled now."""
        rec = self.by_request_id.get(e.request_id)
        if rec is None:
            self.unmatched += 1
            return None
        if rec.span is not None:  # an exporter's retry of a span already here: nothing new
            return None
        self.matched += 1
        rec.span = e
        if rec.status != "running":
            self.settle(rec)
        return rec

    def settle(self, rec: TurnRecord) -> None:
        """A finished turn with its span: fill what the metrics did not give, or check what they did."""
        span = rec.span
        assert span is not None
        rec.engine_ttft_s = span.ttft_s  # only the span says it: the response's metrics time from scheduling
        if rec.engine_prefill_s is None and span.prefill_s is not None:
            rec.queued_s, rec.engine_prefill_s, rec.engine_decode_s = span.queued_s, span.prefill_s, span.decode_s
            rec.engine_timing = "span"
            return
        pairs = [(rec.queued_s, span.queued_s), (rec.engine_prefill_s, span.prefill_s)]
        pairs.append((rec.engine_decode_s, span.decode_s))
        diffs = [abs(a - b) for a, b in pairs if a is not None and b is not None]
        if diffs:
            worst = max(diffs)
            rec.span_disagreement_s = worst
            self.max_disagreement_s = max(worst, self.max_disagreement_s or 0.0)

    def error(self, e: ev.TraceReceiverError) -> None:
        self.errors += 1
        self.last_error = e.error
