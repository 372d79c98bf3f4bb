"""The per-turn table, specified once: each column's head, the TurnRow field it shows (and sorts by) and how
its cell reads. The text report, the report screen and a session's focus screen all draw their tables from it,
so the same turn reads the same everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from rampwatch.drivers.model.turns import TurnRow
from rampwatch.drivers.present.format import fmt_num, format_tokens, needle_mark, pct


class TurnColumn(NamedTuple):
    head: str
    field: str  # the TurnRow field the column shows, and sorts by
    cell: Callable[[TurnRow], str]
    align: str = "right"


TURN_COLUMNS: tuple[TurnColumn, ...] = (
    TurnColumn("turn", "turn", lambda r: str(r.turn)),
    TurnColumn("context", "context_tokens", lambda r: format_tokens(r.context_tokens)),
    TurnColumn("new", "new_tokens", lambda r: format_tokens(r.new_tokens)),
    TurnColumn("cached", "cached_tokens", lambda r: format_tokens(r.cached_tokens)),
    TurnColumn("transferred", "transferred_tokens", lambda r: format_tokens(r.transferred_tokens)),
    TurnColumn("xfer s", "transfer_s", lambda r: fmt_num(r.transfer_s, ".2f")),
    TurnColumn("TTFT s", "ttft_s", lambda r: fmt_num(r.ttft_s, ".2f")),
    TurnColumn("TTFA s", "ttfa_s", lambda r: fmt_num(r.ttfa_s, ".2f")),
    TurnColumn("prefill tok/s", "prefill_tok_s", lambda r: fmt_num(r.prefill_tok_s, ",.0f")),
    TurnColumn("decode tok/s", "decode_tok_s", lambda r: fmt_num(r.decode_tok_s, ".1f")),
    TurnColumn("out", "output_tokens", lambda r: str(r.output_tokens)),
    TurnColumn("reasoning", "reasoning_tokens", lambda r: str(r.reasoning_tokens)),
    TurnColumn("hit", "hit_rate", lambda r: pct(r.hit_rate)),
    TurnColumn("KV peak", "kv_peak", lambda r: pct(r.kv_peak)),
    TurnColumn("gap p50", "gap_p50_s", lambda r: fmt_num(r.gap_p50_s, ".3f")),
    TurnColumn("gap p99", "gap_p99_s", lambda r: fmt_num(r.gap_p99_s, ".3f")),
    TurnColumn("max gap", "gap_max_s", lambda r: fmt_num(r.gap_max_s, ".2f")),
    TurnColumn(">100ms", "gaps_over_100ms", lambda r: str(r.gaps_over_100ms)),
    TurnColumn(">1s", "gaps_over_1s", lambda r: str(r.gaps_over_1s)),
    TurnColumn("needle", "needle", lambda r: needle_mark(r.needle, r.no_answer), "left"),
    TurnColumn("client", "client_busy", lambda r: "busy" if r.client_busy else "", "left"),
    TurnColumn("error", "error", lambda r: r.error or "", "left"),
)
ALL_COLUMNS = tuple(c.head for c in TURN_COLUMNS)
BY_HEAD = {c.head: c for c in TURN_COLUMNS}
REASONING_HEADS = ("TTFA s", "reasoning")  # shown where some turn reasoned: else TTFA is the TTFT and reasoning 0
TRANSFER_HEADS = ("transferred", "xfer s")  # shown where some turn's KV came from a split's prefill server
# The table of a run that did not reason and was not split.
COLUMNS = tuple(h for h in ALL_COLUMNS if h not in REASONING_HEADS + TRANSFER_HEADS)


def shown_columns(rows: list[TurnRow], heads: tuple[str, ...] = ALL_COLUMNS) -> tuple[str, ...]:
    """`heads`, less the reasoning columns when no turn of `rows` reasoned, and less the transfer column
    when no turn was served by a prefill/decode split."""
    hidden = () if any(r.reasoning_tokens or r.no_answer for r in rows) else REASONING_HEADS
    if not any(r.transferred_tokens is not None for r in rows):
        hidden += TRANSFER_HEADS[:1]
    if not any(r.transfer_s is not None for r in rows):
        hidden += TRANSFER_HEADS[1:]
    return tuple(h for h in heads if h not in hidden)


def row_cells(r: TurnRow, heads: tuple[str, ...] | list[str] = COLUMNS) -> list[str]:
    """One turn's cells under the columns `heads` (every column by default)."""
    return [BY_HEAD[h].cell(r) for h in heads]
