"""The per-turn table, specified once: each column's head, the TurnRow field it shows (and sorts by) and how
its cell reads. The text report, the report screen and a session's focus screen all draw their tables from it,
so the same turn reads the same everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from rampwatch.drivers.model.ttft_split import TtftSplit
from rampwatch.drivers.model.turn_row import TurnRow
from rampwatch.drivers.present.format import fmt_num, format_tokens, needle_mark, pct


def rest_wrong(r: TurnRow) -> bool:
    """The engine's figures exceed the client's TTFT beyond clock tolerance (TtftSplit.contradicts, on the row)."""
    if r.ttft_rest_s is None or r.engine_prefill_s is None:
        return False
    return TtftSplit(r.queued_s, r.engine_prefill_s, r.ttft_rest_s, r.ttft_front_end_s, r.ttft_client_s).contradicts


def spec_cell(r: TurnRow) -> str:
    """Speculative decoding: accepted/drafted draft tokens."""
    return f"{r.spec_accepted}/{r.spec_drafted}" if r.spec_accepted is not None and r.spec_drafted else "-"


def served_cell(r: TurnRow) -> str:
    """The backend that served the turn, `ambiguous` where overlapping turns hid it, `-` where nothing said."""
    return "ambiguous" if r.served_by_source == "ambiguous" else r.served_by or "-"


class TurnColumn(NamedTuple):
    head: str
    field: str  # the TurnRow field the column shows, and sorts by unless `order` says otherwise
    cell: Callable[[TurnRow], str]
    align: str = "right"
    order: Callable[[TurnRow], object] | None = None  # the sort key, where the cell reads more than `field`

    def sort_value(self, r: TurnRow) -> object:
        """What the column sorts `r` by (None: no value; the report screen puts such rows last)."""
        return self.order(r) if self.order else getattr(r, self.field)


TURN_COLUMNS: tuple[TurnColumn, ...] = (
    TurnColumn("turn", "turn", lambda r: str(r.turn)),
    TurnColumn("context", "context_tokens", lambda r: format_tokens(r.context_tokens)),
    TurnColumn("new", "new_tokens", lambda r: format_tokens(r.new_tokens)),
    TurnColumn("cached", "cached_tokens", lambda r: format_tokens(r.cached_tokens)),
    TurnColumn("transferred", "transferred_tokens", lambda r: format_tokens(r.transferred_tokens)),
    TurnColumn("xfer s", "transfer_s", lambda r: fmt_num(r.transfer_s, ".2f")),
    TurnColumn("TTFT s", "ttft_s", lambda r: fmt_num(r.ttft_s, ".2f")),
    TurnColumn("queued s", "queued_s", lambda r: fmt_num(r.queued_s, ".2f")),
    TurnColumn("engine prefill s", "engine_prefill_s", lambda r: fmt_num(r.engine_prefill_s, ".2f")),
    # The rest of the TTFT (client, network, HTTP, tokenizer); '!' where the engine's figures exceed the TTFT.
    TurnColumn("rest s", "ttft_rest_s", lambda r: fmt_num(r.ttft_rest_s, ".2f") + ("!" if rest_wrong(r) else "")),
    # The rest split by the engine's own TTFT (its span): the server's front end, and the client's side of it.
    TurnColumn("front end s", "ttft_front_end_s", lambda r: fmt_num(r.ttft_front_end_s, ".3f")),
    TurnColumn("client s", "ttft_client_s", lambda r: fmt_num(r.ttft_client_s, ".3f")),
    TurnColumn("TTFA s", "ttfa_s", lambda r: fmt_num(r.ttfa_s, ".2f")),
    TurnColumn("prefill tok/s", "prefill_tok_s", lambda r: fmt_num(r.prefill_tok_s, ",.0f")),
    TurnColumn("decode tok/s", "decode_tok_s", lambda r: fmt_num(r.decode_tok_s, ".1f")),
    TurnColumn("out", "output_tokens", lambda r: str(r.output_tokens)),
    TurnColumn("reasoning", "reasoning_tokens", lambda r: str(r.reasoning_tokens)),
    TurnColumn("answer", "answer_tokens", lambda r: str(r.answer_tokens)),
    TurnColumn("spec", "spec_accepted", lambda r: spec_cell(r)),
    TurnColumn("hit", "hit_rate", lambda r: pct(r.hit_rate)),
    # Behind a router: the backend that served the turn (its span, or the backends' counters).
    TurnColumn("served by", "served_by", served_cell, "left", lambda r: (r.served_by_source or "", r.served_by or "")),
    # --trace: what the trace's blocks allowed a prefix cache to hold, and cached over that.
    TurnColumn("ideal", "ideal_cached_tokens", lambda r: format_tokens(r.ideal_cached_tokens)),
    TurnColumn("reuse eff", "cache_efficiency", lambda r: pct(r.cache_efficiency)),
    TurnColumn("KV peak", "kv_peak", lambda r: pct(r.kv_peak)),
    TurnColumn("gap p50", "gap_p50_s", lambda r: fmt_num(r.gap_p50_s, ".3f")),
    TurnColumn("gap p99", "gap_p99_s", lambda r: fmt_num(r.gap_p99_s, ".3f")),
    TurnColumn("max gap", "gap_max_s", lambda r: fmt_num(r.gap_max_s, ".2f")),
    TurnColumn(">100ms", "gaps_over_100ms", lambda r: str(r.gaps_over_100ms)),
    TurnColumn(">1s", "gaps_over_1s", lambda r: str(r.gaps_over_1s)),
    TurnColumn("needle", "needle", lambda r: needle_mark(r.needle, r.no_answer), "left"),
    # Unmarked, then the machine's marks (os), then the driver's own (busy).
    TurnColumn(
        "client",
        "client_busy",
        lambda r: client_mark(r.client_busy, r.client_busy_own),
        "left",
        lambda r: (r.client_busy, r.client_busy_own),
    ),
    # Open loop: how long after its due time a late turn was sent (its latency counts from the due time).
    TurnColumn("late ms", "send_lag_s", lambda r: fmt_num(r.send_lag_s * 1000, ".0f") if r.late else ""),
    TurnColumn("SLO", "slo_met", lambda r: "-" if r.slo_met is None else "met" if r.slo_met else "MISS", "left"),
    TurnColumn("error", "error", lambda r: r.error or "", "left"),
)
ALL_COLUMNS = tuple(c.head for c in TURN_COLUMNS)
BY_HEAD = {c.head: c for c in TURN_COLUMNS}
# Shown where some turn reasoned: else TTFA is the TTFT, reasoning 0 and the answer all of the output.
REASONING_HEADS = ("TTFA s", "reasoning", "answer")
ENGINE_HEADS = ("queued s", "engine prefill s", "rest s")  # shown where the engine timed some turn itself
FRONT_END_HEADS = ("front end s", "client s")  # shown where the engine's span gave some turn's own TTFT
SPEC_HEADS = ("spec",)  # shown where some turn drafted speculative tokens
# A prefill/decode split: the KV the decode side received, and (behind rampwatch's own proxy) its transfer time.
TRANSFER_HEADS = ("transferred", "xfer s")
LATE_HEADS = ("late ms",)  # shown where some turn had a due time (--arrivals)
SLO_HEADS = ("SLO",)  # shown where the turns were judged (--slo)
TRACE_HEADS = ("ideal", "reuse eff")  # shown where the turns came from a trace (--trace)
SERVED_HEADS = ("served by",)  # shown where some turn's backend was told (a span's, or the backends' counters)
# Each optional group of columns, whether a turn calls for it, and the width it adds to the text table.
OPTIONAL: tuple[tuple[tuple[str, ...], Callable[[TurnRow], bool], int], ...] = (
    (REASONING_HEADS, lambda r: bool(r.reasoning_tokens or r.no_answer), 38),
    (ENGINE_HEADS, lambda r: r.engine_prefill_s is not None, 36),
    (FRONT_END_HEADS, lambda r: r.ttft_client_s is not None, 24),
    (SPEC_HEADS, lambda r: bool(r.spec_drafted), 10),
    (TRANSFER_HEADS[:1], lambda r: r.transferred_tokens is not None, 14),
    (TRANSFER_HEADS[1:], lambda r: r.transfer_s is not None, 14),
    (LATE_HEADS, lambda r: r.due_s is not None, 10),
    (SLO_HEADS, lambda r: r.slo_met is not None, 7),
    (TRACE_HEADS, lambda r: r.ideal_cached_tokens is not None, 20),
    (SERVED_HEADS, lambda r: r.served_by_source is not None, 12),
)
COLUMNS = tuple(h for h in ALL_COLUMNS if not any(h in heads for heads, _, _ in OPTIONAL))  # none called for


def shown_columns(rows: list[TurnRow], heads: tuple[str, ...] = ALL_COLUMNS) -> tuple[str, ...]:
    """`heads`, less each optional group (reasoning, the engine's timing and its front end, speculation, a split's
    transfer, an open loop's late sends, SLO verdicts) no turn of `rows` calls for."""
    hidden = {h for group, wanted, _ in OPTIONAL if not any(map(wanted, rows)) for h in group}
    return tuple(h for h in heads if h not in hidden)


def extra_width(heads: tuple[str, ...]) -> int:
    """What the optional groups shown in `heads` add to a text table's width."""
    return sum(width for group, _, width in OPTIONAL if group[0] in heads)


def row_cells(r: TurnRow, heads: tuple[str, ...] | list[str] = COLUMNS) -> list[str]:
    """One turn's cells under the columns `heads` (every column by default)."""
    return [BY_HEAD[h].cell(r) for h in heads]


def client_mark(busy: bool, own: bool) -> str:
    """`busy`: the driver's own work held its loop while it stamped the turn; `os`: only the machine waking it
    late did (its stamps may be late either way)."""
    return "" if not busy else "busy" if own else "os"
