"""`rampwatch compare` as text: the runs table and TTFT per turn side by side, fitted to a terminal by leaving
columns out in a known order (and saying which), or whole as markdown, CSV or JSON."""

from __future__ import annotations

import csv
import io

import msgspec
from rich.console import Console
from rich.table import Table

from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.present.compare import NO_HIT_COUNTERS, Comparison, RunRow
from rampwatch.drivers.present.format import fmt_num, format_tokens, pct
from rampwatch.drivers.present.summary import needle_count

COMPARE_COLUMNS = (
    ("run", lambda r: r.label),
    ("engine", lambda r: f"{r.engine} {r.engine_version}".strip()),
    ("sessions", lambda r: f"{r.sessions}{' lockstep' if r.lockstep else ''}"),
    ("turns", lambda r: f"{r.turns_completed}/{r.turns_planned}"),
    ("context", lambda r: format_tokens(r.context_reached)),
    ("slowest TTFT sum s", lambda r: fmt_num(r.slowest_session_ttft_sum_s, ".2f")),
    ("queued sum s", lambda r: fmt_num(r.slowest_session_queued_sum_s, ".2f")),
    ("engine prefill sum s", lambda r: fmt_num(r.slowest_session_engine_prefill_sum_s, ".2f")),
    ("front end sum s", lambda r: fmt_num(r.slowest_session_front_end_sum_s, ".2f")),
    ("longest s", lambda r: fmt_num(r.ttft_max_s, ".2f")),
    ("last turn s", lambda r: fmt_num(r.last_turn_ttft_s, ".2f")),
    ("one-shot s", lambda r: fmt_num(r.one_shot_ttft_s, ".2f")),
    ("prefill tok/s first", lambda r: fmt_num(r.prefill_tok_s_first_turn, ",.0f")),
    ("prefill tok/s last", lambda r: fmt_num(r.prefill_tok_s_last_turn, ",.0f")),
    ("decode tok/s", lambda r: fmt_num(r.decode_tok_s_median, ".1f")),
    ("hit last", lambda r: "n/a" if isinstance(r.hit_rate_last_turn, str) else pct(r.hit_rate_last_turn)),
    ("cache eff", lambda r: pct(r.cache_efficiency)),
    ("affinity", lambda r: pct(r.affinity) + (f" ({r.moved_sessions} moved)" if r.moved_sessions else "")),
    ("KV peak", lambda r: pct(r.kv_peak)),
    ("TTFA longest s", lambda r: fmt_num(r.ttfa_max_s, ".2f")),
    ("reasoning", lambda r: format_tokens(r.reasoning_tokens)),
    ("needle", lambda r: needle_count(r.needle_found, r.needle_asked, r.needle_no_answer)),
    ("worst stall s", lambda r: fmt_num(r.worst_gap_during_foreign_prefill_s, ".2f")),
    ("failed", lambda r: str(r.failed_turns)),
)

COMPARE_REASONING_HEADS = ("TTFA longest s", "reasoning")  # shown where some run reasoned
COMPARE_ENGINE_HEADS = ("queued sum s", "engine prefill sum s")  # shown where the engine timed some run's turns
COMPARE_FRONT_END_HEADS = ("front end sum s",)  # shown where the engine's spans gave some run's own TTFT
COMPARE_TRACE_HEADS = ("cache eff",)  # shown where some run replayed a trace
COMPARE_ROUTER_HEADS = ("affinity",)  # shown where some run told which backend served its turns


# Where a terminal is too narrow for every column, these are left out, first to last (the rest are the
# campaign's comparison: run, turns, context, TTFT sum, longest, needle, failed).
COMPARE_DROP_ORDER = (
    "front end sum s",
    "cache eff",
    "affinity",
    "queued sum s",
    "engine prefill sum s",
    "reasoning",
    "TTFA longest s",
    "one-shot s",
    "worst stall s",
    "prefill tok/s first",
    "KV peak",
    "engine",
    "hit last",
    "last turn s",
    "prefill tok/s last",
    "sessions",
    "decode tok/s",
)


def two_line_head(head: str) -> str:
    """A head of several words on two lines, split where the longer line is shortest, so that a head costs its
    column little width ("slowest TTFT sum s" -> "slowest TTFT" over "sum s")."""
    words = head.split(" ")
    if len(words) < 2:
        return head
    k = min(range(1, len(words)), key=lambda k: max(len(" ".join(words[:k])), len(" ".join(words[k:]))))
    return " ".join(words[:k]) + "\n" + " ".join(words[k:])


def fitted_table(
    title: str,
    heads: list[str],
    rows: list[list[str]],
    left: set[str],
    width: int | None,
    drop_order: tuple[str, ...] = (),
) -> tuple[Table, list[str], bool]:
    """A table whose cells never wrap: at `width`, columns of `drop_order` are left out in that order until it
    fits (None: every column, for a file or a pipe); returns the table, what it left out and whether it fits."""
    console = Console(file=io.StringIO(), width=10_000, color_system=None)
    dropped: list[str] = []
    while True:
        keep = [k for k, h in enumerate(heads) if h not in dropped]
        t = Table(title=title, title_justify="left")
        for k in keep:
            t.add_column(two_line_head(heads[k]), justify="left" if heads[k] in left else "right", no_wrap=True)
        for row in rows:
            t.add_row(*(row[k] for k in keep))
        over = 0 if width is None else console.measure(t).maximum - width
        more = [h for h in drop_order if h in heads and h not in dropped]
        if over <= 0 or not more:
            break
        dropped.append(more[0])
    if over > 0:  # still too wide: the first column (the labels) gives up what is missing, ending in "…"
        first = max([len(heads[0])] + [len(row[0]) for row in rows])
        t.columns[0].max_width = max(6, first - over)
    return t, dropped, over <= 0


def csv_cell(value: object) -> object:
    """A CSV cell: nothing for None, a list's items joined by ';' (every session's sum in one cell)."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    return value


def engine_account(queued_s: float | None, prefill_s: float | None, front_end_s: float | None = None) -> str:
    """'57.10 + 57.20' (+ ' + 0.48' where the engine's span gave the front end): the engine's queued, prefill and
    front-end seconds of a turn's TTFT ('-': not timed); the client's side is the rest."""
    if prefill_s is None:
        return "-"
    text = f"{fmt_num(queued_s, '.2f')} + {fmt_num(prefill_s, '.2f')}"
    return text + f" + {front_end_s:.2f}" if front_end_s is not None else text


def render_comparison(cmp: Comparison, fmt: str, width: int | None = None) -> str:
    """The runs table, then TTFT per turn side by side with the ratio to the baseline run. `width`: the
    terminal's (columns are left out to fit, and said); None: a file or a pipe gets every column."""
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(cmp).decode(), indent=2)
    reasoned = any(r.reasoning_tokens or r.needle_no_answer for r in cmp.runs)
    timed = any(r.slowest_session_engine_prefill_sum_s is not None for r in cmp.runs)
    fronted = any(r.slowest_session_front_end_sum_s is not None for r in cmp.runs)
    routed = any(r.affinity is not None or r.moved_sessions is not None for r in cmp.runs)
    hidden = (
        (() if reasoned else COMPARE_REASONING_HEADS)
        + (() if timed else COMPARE_ENGINE_HEADS)
        + (() if fronted else COMPARE_FRONT_END_HEADS)
        + (() if any(r.cache_efficiency is not None for r in cmp.runs) else COMPARE_TRACE_HEADS)
        + (() if routed else COMPARE_ROUTER_HEADS)
    )
    columns = [c for c in COMPARE_COLUMNS if c[0] not in hidden]
    heads = [name for name, _ in columns]
    rows = [[cell(r) for _, cell in columns] for r in cmp.runs]
    # The engine's account of each timed run's TTFT: queued + engine prefill (the rest is the TTFT's remainder).
    split_runs = [k for k, r in enumerate(cmp.runs) if r.slowest_session_engine_prefill_sum_s is not None]
    ratio_heads = [f"{r.label} / {cmp.baseline}" for r in cmp.runs[1:]]
    account = "queued + prefill + front end s" if fronted else "queued + prefill s"
    account_heads = [f"{cmp.runs[k].label} {account}" for k in split_runs]
    # Where some run reasoned: each run's time to the first answer token on the turn (its slowest session's).
    ttfa_heads = [f"{r.label} TTFA s" for r in cmp.runs] if reasoned else []
    # Behind a router: each run's backend for that turn (its slowest session's).
    served_heads = [f"{r.label} served by" for r in cmp.runs] if routed else []
    turn_heads = ["turn"] + [f"{r.label} TTFT s" for r in cmp.runs] + ttfa_heads + ratio_heads + account_heads
    turn_heads += served_heads
    turn_rows = [
        [str(c.turn)]
        + [fmt_num(x, ".2f") for x in c.ttft_s]
        + ([fmt_num(x, ".2f") for x in c.ttfa_s] if reasoned else [])
        + [fmt_num(x, ".2f") for x in c.ratio_to_baseline[1:]]
        + [engine_account(c.queued_s[k], c.engine_prefill_s[k], c.front_end_s[k]) for k in split_runs]
        + ([x or "-" for x in c.served_by] if routed else [])
        for c in cmp.turns
    ]
    notes = list(cmp.notes)
    for r in cmp.runs:
        if r.slo is not None:
            per_min = f", {r.slo_turns_met_per_min:.2f}/min" if r.slo_turns_met_per_min is not None else ""
            conv = r.slo_conversations_met_per_min
            conv_min = f", {conv:.2f}/min" if conv is not None else ""
            late = f"; {r.late_turns} sent late" if r.late_turns is not None else ""
            notes.append(
                f"goodput {r.label} (SLO {r.slo}): {counted(r.slo_turns_met, 'turn')} met it{per_min}; "
                f"{r.slo_conversations_met} conversations met it on every turn{conv_min}{late}"
            )
    if any(isinstance(r.hit_rate_last_turn, str) for r in cmp.runs):
        notes.append(f"hit last n/a: {NO_HIT_COUNTERS.removeprefix('n/a: ')}")
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(RunRow.__struct_fields__)
        for r in cmp.runs:
            w.writerow([csv_cell(v) for v in msgspec.structs.astuple(r)])
        return out.getvalue()
    if fmt == "md":
        parts = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        parts += ["| " + " | ".join(row) + " |" for row in rows]
        parts += ["", "| " + " | ".join(turn_heads) + " |", "|" + "---|" * len(turn_heads)]
        parts += ["| " + " | ".join(row) + " |" for row in turn_rows]
        parts += [""] + [f"- {n}" for n in notes]
        return "\n".join(parts) + "\n"
    console = Console(file=io.StringIO(), width=width or 10_000, force_terminal=False, color_system=None)
    left = {"run", "engine", "hit last"}
    runs_table, left_out, _ = fitted_table(
        "runs (several sessions: the slowest session's figures)", heads, rows, left, width, COMPARE_DROP_ORDER
    )
    console.print(runs_table)
    turn_title = f"TTFT per turn (slowest session), ratio to {cmp.baseline}"
    turns_table, dropped, fits = fitted_table(
        turn_title, turn_heads, turn_rows, left, width, tuple(served_heads + account_heads + ttfa_heads + ratio_heads)
    )
    if not fits:  # the runs' labels are too long for the width: number them, and say which is which
        short = ["turn"] + [f"#{k + 1} TTFT s" for k in range(len(cmp.runs))]
        turns_table, _, _ = fitted_table(turn_title, short, [row[: len(short)] for row in turn_rows], left, width)
        notes.append("; ".join(f"#{k + 1}: {r.label}" for k, r in enumerate(cmp.runs)))
    console.print(turns_table)
    if dropped:
        left_out.append("the engine's account, TTFA, the ratios to the baseline or the backends")
    if left_out:
        notes.append(
            f"left out to fit {width} columns: {', '.join(left_out)} (every column: a wider terminal, "
            "or pipe it, or --format md/csv/json)"
        )
    for n in notes:
        console.print(f"note: {n}")
    return console.file.getvalue()  # type: ignore[attr-defined]
