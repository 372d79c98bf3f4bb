"""Turns a Report into text: a human table, markdown, CSV or the pinned JSON."""

from __future__ import annotations

import csv
import io
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from rampwatch.drivers.model.analysis import Report, RunInfo, SessionSummary, SpanFigures
from rampwatch.drivers.model.events import PromptShape
from rampwatch.drivers.model.modelled import speed_up
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turns import GapStats, TurnRow, engine_timing_hint
from rampwatch.drivers.present.compare import NO_HIT_COUNTERS, Comparison, RunRow
from rampwatch.drivers.present.format import fmt_num, format_tokens, pct
from rampwatch.drivers.present.turn_table import BY_HEAD, extra_width, row_cells, shown_columns

FORMATS = ("table", "md", "csv", "json")


def report_title(r: RunInfo) -> str:
    """The report's first line; a sped-up demo's says its times are modelled."""
    title = f"rampwatch report: {r.model} on {r.engine} at {r.server}, started {r.started_at}"
    if r.time_scale and r.time_scale != 1.0:
        title += f" ({speed_up(r.time_scale)})"
    return title


def needle_count(found: int, asked: int, no_answer: int) -> str:
    """found/asked, and how many of those turns were cut before any answer."""
    return f"{found}/{asked}" + (f" ({no_answer} no answer)" if no_answer else "")


def summary_lines(rep: Report) -> list[str]:
    lines = []
    for s in rep.sessions:
        m = s.summary
        reached = f", reached turn {m.reached_turn}/{m.planned_turns}" if m.reached_turn < m.planned_turns else ""
        answered = any(t.ttfa_s is not None for t in s.turns)
        reasoned = f", reasoning {m.reasoning_tokens:,} tok" if m.reasoning_tokens else ""
        if reasoned and answered:
            reasoned += f", time to first answer sum {m.ttfa_sum_s:.2f}s"
        lines.append(
            f"{s.id}: {m.turns} turns{reached}, TTFT sum {m.ttft_sum_s:.2f}s, longest {m.ttft_max_s:.2f}s, "
            f"decode median {fmt_num(m.decode_tok_s_median, '.1f')} tok/s, "
            f"needle {needle_count(m.needle_found, m.turns, m.needle_no_answer)}" + reasoned + _engine_sums(m)
        )
    i = rep.interference
    if i.overlapping_turns:
        worst = i.gaps_during_foreign_prefill.max_s if i.gaps_during_foreign_prefill else None
        lines.append(
            f"interference: decode median {fmt_num(i.decode_tok_s_alone_median, '.1f')} tok/s alone vs "
            f"{fmt_num(i.decode_tok_s_during_foreign_prefill_median, '.1f')} tok/s while another session prefills "
            f"({i.overlapping_turns} overlapping turns); worst gap during a foreign prefill {fmt_num(worst, '.2f')}s"
        )
    if i.extra_wait_s is not None and i.extra_wait_queued_s is not None:
        share = f" ({i.extra_wait_queued_s / i.extra_wait_s:.0%})" if i.extra_wait_s > 0 else ""
        lines.append(
            f"interference: the slowest session waited {i.extra_wait_s:.2f}s longer in all, "
            f"{i.extra_wait_queued_s:.2f}s{share} of it queued in the engine (behind another session's prefill)"
        )
    turns = [t for s in rep.sessions for t in s.turns]
    if turns and all(t.engine_prefill_s is None for t in turns):
        lines.append(engine_timing_hint(rep.run.engine))
    if rep.spans is not None:
        lines.append(span_line(rep.spans))
    if i.gaps_alone or i.gaps_during_foreign_prefill:
        lines.append(
            f"inter-token gaps: alone {_gaps(i.gaps_alone)}; during another session's prefill "
            f"{_gaps(i.gaps_during_foreign_prefill)}"
        )
    if rep.turn_spread:
        ratios = ", ".join(f"{x.ratio:.2f}" for x in rep.turn_spread)
        lines.append(f"slowest/fastest TTFT per turn: median {fmt_num(rep.ttft_ratio_median, '.2f')} ({ratios})")
    if rep.one_shot is not None:
        shot = rep.one_shot.turn
        for r in rep.one_shot.ramps:
            lines.append(
                f"ramp {r.session}: summed TTFT {r.ramp_ttft_sum_s:.2f}s, longest {r.ramp_ttft_max_s:.2f}s; "
                f"one-shot ({format_tokens(shot.context_tokens)}, {format_tokens(shot.cached_tokens)} cached): "
                f"{fmt_num(shot.ttft_s, '.2f')}s; sum/one-shot "
                f"{r.sum_ratio:.2f}, longest/one-shot {r.longest_ratio:.2f}"
            )
    run = rep.run
    modes = [
        m
        for m in (
            "lockstep" if run.lockstep else "",
            "strict needle" if run.needle_mode == "strict" else "",
            f"time limit {run.time_limit_s:g}s" if run.time_limit_s else "",
            f"reasoning {run.reasoning}" if run.reasoning != "auto" else "",
            f"max tokens {run.max_tokens}" if run.max_tokens else "",
        )
        if m
    ]
    lines.append(f"run: {run.status or 'running'}" + (f" ({', '.join(modes)})" if modes else ""))
    if run.extra_body or run.request_headers:
        lines.append("requests: " + request_options_text(run.extra_body, run.request_headers))
    if rep.client_lag_max_ms is not None:
        turns = [t for s in rep.sessions for t in s.turns]
        busy = sum(t.client_busy for t in turns)
        lines.append(
            f"client: event-loop lag worst {rep.client_lag_max_ms:.0f} ms; {busy} of {len(turns)} turns client busy "
            "(a stamp taken while it ran over 5 ms late)"
        )
    lines += open_loop_lines(rep)
    if run.prompts is not None:
        lines.append(prompts_line(run.prompts, [t.think_s for s in rep.sessions for t in s.turns]))
    lines.append(f"server: KV peak {pct(rep.server.kv_peak)}, hit rate last turn {pct(rep.server.hit_rate_last_turn)}")
    return lines


def open_loop_lines(rep: Report) -> list[str]:
    """--arrivals and --slo: how users arrived, the turns sent late, and the goodput."""
    lines = []
    o, g = rep.open_loop, rep.goodput
    if o is not None:
        cap = f", at most {o.max_live} live" if o.max_live else ""
        lag = f" (worst {o.send_lag_max_s * 1000:.0f} ms)" if o.send_lag_max_s is not None else ""
        ttft = (
            f"; TTFT p50 {o.ttft_from_due_p50_s:.2f}s from due, {o.ttft_from_send_p50_s:.2f}s from send"
            if o.ttft_from_due_p50_s is not None and o.ttft_from_send_p50_s is not None
            else ""
        )
        lines.append(
            f"arrivals: {o.arrivals_per_min:g}/min (seed {o.seed}){cap}, {o.arrived} arrived; "
            f"{o.late_turns} turns sent over 10 ms late{lag}{ttft}"
        )
    if g is not None:
        per_min = f", {g.turns_met_per_min:.2f} turns/min" if g.turns_met_per_min is not None else ""
        lines.append(
            f"goodput (SLO {g.slo}): {g.turns_met} of {g.turns} turns met it{per_min}; "
            f"{g.conversations_met} of {g.conversations} conversations met it on every turn"
            + (f"; warmup: {g.warmup} left out ({g.warmup_turns} turns)" if g.warmup else "")
        )
    return lines


def _engine_sums(m: SessionSummary) -> str:
    """The engine's own account summed over a session's turns, where it gave one."""
    if m.engine_prefill_sum_s is None:
        return ""
    queued = f"queued {m.queued_sum_s:.2f}s, " if m.queued_sum_s is not None else ""
    return f"; engine: {queued}prefill {m.engine_prefill_sum_s:.2f}s"


def request_options_text(extra_body: dict[str, Any], headers: dict[str, str]) -> str:
    """--extra-body and --header in one line, as the report and the run's header show them."""
    parts = [f"body {msgspec.json.encode(extra_body).decode()}"] if extra_body else []
    parts += [f"header {name}: {value}" for name, value in headers.items()]
    return "; ".join(parts)


def prompts_line(p: PromptShape, pauses: list[float | None]) -> str:
    """How the prompts were made: the shared lead, the corpus, the user's pauses."""
    parts = []
    if p.system_prompt_chars:
        parts.append(f"system prompt {p.system_prompt_chars:,} chars (sha256 {p.system_prompt_sha256[:12]})")
    if p.shared_prefix_tokens:
        counted = f", {p.shared_prefix_measured:,} counted" if p.shared_prefix_measured is not None else ""
        parts.append(f"shared prefix {p.shared_prefix_tokens:,} tokens{counted}")
    if p.lead_tokens:
        parts.append(f"{p.lead_tokens:,} tokens open every session")
    if p.corpus:
        parts.append(f"corpus {p.corpus} ({p.corpus_files:,} files, {p.corpus_chars:,} chars)")
    if p.think_time_s is not None:
        low, high = p.think_time_s
        taken = [x for x in pauses if x is not None]
        spec = f"{low:g}s" if low == high else f"{low:g}s..{high:g}s"
        parts.append(f"think time {spec}" + (f" (median pause {median(taken):.2f}s)" if taken else ""))
    return "prompts: " + "; ".join(parts)


def _gaps(g: GapStats | None) -> str:
    if g is None:
        return "-"
    return f"p50 {g.p50_s:.3f}s p99 {g.p99_s:.3f}s max {g.max_s:.2f}s, {g.over_100ms} over 100 ms, {g.over_1s} over 1 s"


def _turn_tables(rep: Report) -> list[tuple[str, str, list[TurnRow]]]:
    """(session, title, rows) per ramp session, then the one-shot baseline."""
    tables = [(s.id, f"session {s.id}", s.turns) for s in rep.sessions]
    if rep.one_shot is not None:
        tables.append(("one-shot", "one-shot baseline", [rep.one_shot.turn]))
    return tables


def render(rep: Report, fmt: str, width: int = 140) -> str:
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(rep).decode(), indent=2)
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(["session", *TurnRow.__struct_fields__])
        for session, _, rows in _turn_tables(rep):
            for r in rows:
                w.writerow([session, *("" if v is None else v for v in msgspec.structs.astuple(r))])
        return out.getvalue()
    r = rep.run
    title = report_title(r)
    heads = shown_columns([t for _, _, rows in _turn_tables(rep) for t in rows])
    if fmt == "md":
        parts = [f"## {title}", ""]
        for _, title, rows in _turn_tables(rep):
            parts += [f"### {title}", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
            parts += ["| " + " | ".join(row_cells(t, heads)) + " |" for t in rows]
            parts.append("")
        parts += [f"- {line}" for line in summary_lines(rep)]
        return "\n".join(parts) + "\n"
    # The optional columns (reasoning, the engine's timing, speculation) come on top of the width laid out for.
    width += extra_width(heads)
    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    console.print(title)
    for _, title, rows in _turn_tables(rep):
        t = Table(title=title, title_justify="left")
        for c in heads:
            t.add_column(c, justify=BY_HEAD[c].align, no_wrap=c == "needle")  # 'no answer' on one line
        for row in rows:
            t.add_row(*row_cells(row, heads))
        console.print(t)
    for line in summary_lines(rep):
        console.print(line)
    return console.file.getvalue()  # type: ignore[attr-defined]


COMPARE_COLUMNS = (
    ("run", lambda r: r.label),
    ("engine", lambda r: f"{r.engine} {r.engine_version}".strip()),
    ("sessions", lambda r: f"{r.sessions}{' lockstep' if r.lockstep else ''}"),
    ("turns", lambda r: f"{r.turns_completed}/{r.turns_planned}"),
    ("context", lambda r: format_tokens(r.context_reached)),
    ("slowest TTFT sum s", lambda r: fmt_num(r.slowest_session_ttft_sum_s, ".2f")),
    ("queued sum s", lambda r: fmt_num(r.slowest_session_queued_sum_s, ".2f")),
    ("engine prefill sum s", lambda r: fmt_num(r.slowest_session_engine_prefill_sum_s, ".2f")),
    ("longest s", lambda r: fmt_num(r.ttft_max_s, ".2f")),
    ("last turn s", lambda r: fmt_num(r.last_turn_ttft_s, ".2f")),
    ("one-shot s", lambda r: fmt_num(r.one_shot_ttft_s, ".2f")),
    ("prefill tok/s first", lambda r: fmt_num(r.prefill_tok_s_first_turn, ",.0f")),
    ("prefill tok/s last", lambda r: fmt_num(r.prefill_tok_s_last_turn, ",.0f")),
    ("decode tok/s", lambda r: fmt_num(r.decode_tok_s_median, ".1f")),
    ("hit last", lambda r: "n/a" if isinstance(r.hit_rate_last_turn, str) else pct(r.hit_rate_last_turn)),
    ("KV peak", lambda r: pct(r.kv_peak)),
    ("TTFA longest s", lambda r: fmt_num(r.ttfa_max_s, ".2f")),
    ("reasoning", lambda r: format_tokens(r.reasoning_tokens)),
    ("needle", lambda r: needle_count(r.needle_found, r.needle_asked, r.needle_no_answer)),
    ("worst stall s", lambda r: fmt_num(r.worst_gap_during_foreign_prefill_s, ".2f")),
    ("failed", lambda r: str(r.failed_turns)),
)

COMPARE_REASONING_HEADS = ("TTFA longest s", "reasoning")  # shown where some run reasoned
COMPARE_ENGINE_HEADS = ("queued sum s", "engine prefill sum s")  # shown where the engine timed some run's turns


# Where a terminal is too narrow for every column, these are left out, first to last (the rest are the
# campaign's comparison: run, turns, context, TTFT sum, longest, needle, failed).
COMPARE_DROP_ORDER = (
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


def render_comparison(cmp: Comparison, fmt: str, width: int | None = None) -> str:
    """The runs table, then TTFT per turn side by side with the ratio to the baseline run. `width`: the
    terminal's (columns are left out to fit, and said); None: a file or a pipe gets every column."""
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(cmp).decode(), indent=2)
    reasoned = any(r.reasoning_tokens or r.needle_no_answer for r in cmp.runs)
    timed = any(r.slowest_session_engine_prefill_sum_s is not None for r in cmp.runs)
    hidden = (() if reasoned else COMPARE_REASONING_HEADS) + (() if timed else COMPARE_ENGINE_HEADS)
    columns = [c for c in COMPARE_COLUMNS if c[0] not in hidden]
    heads = [name for name, _ in columns]
    rows = [[cell(r) for _, cell in columns] for r in cmp.runs]
    turn_heads = (
        ["turn"] + [f"{r.label} TTFT s" for r in cmp.runs] + [f"{r.label} / {cmp.baseline}" for r in cmp.runs[1:]]
    )
    turn_rows = [
        [str(c.turn)] + [fmt_num(x, ".2f") for x in c.ttft_s] + [fmt_num(x, ".2f") for x in c.ratio_to_baseline[1:]]
        for c in cmp.turns
    ]
    notes = list(cmp.notes)
    for r in cmp.runs:
        if r.slo is not None:
            per_min = f", {r.slo_turns_met_per_min:.2f}/min" if r.slo_turns_met_per_min is not None else ""
            late = f"; {r.late_turns} sent late" if r.late_turns is not None else ""
            notes.append(f"goodput {r.label} (SLO {r.slo}): {r.slo_turns_met} turns met it{per_min}{late}")
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
        turn_title, turn_heads, turn_rows, left, width, tuple(turn_heads[1 + len(cmp.runs) :])
    )
    if not fits:  # the runs' labels are too long for the width: number them, and say which is which
        short = ["turn"] + [f"#{k + 1} TTFT s" for k in range(len(cmp.runs))]
        turns_table, _, _ = fitted_table(turn_title, short, [row[: len(short)] for row in turn_rows], left, width)
        notes.append("; ".join(f"#{k + 1}: {r.label}" for k, r in enumerate(cmp.runs)))
    console.print(turns_table)
    if dropped:
        left_out.append("the ratios to the baseline")
    if left_out:
        notes.append(
            f"left out to fit {width} columns: {', '.join(left_out)} (every column: a wider terminal, "
            "or pipe it, or --format md/csv/json)"
        )
    for n in notes:
        console.print(f"note: {n}")
    return console.file.getvalue()  # type: ignore[attr-defined]


def render_curve(points: list[tuple[int, Report, float | None]]) -> str:
    """A sweep's curve, one row per (session count, its report, preemptions): last-turn TTFT
    slowest/fastest, decode alone/during a foreign prefill, worst stall, KV peak, how it ended."""
    table = Table(title="sweep: one point per session count (lockstep)", title_justify="left")
    for c in (
        "sessions",
        "last turn TTFT slowest s",
        "fastest s",
        "decode alone tok/s",
        "decode during prefill tok/s",
        "worst stall s",
        "KV peak",
        "preemptions",
        "status",
    ):
        table.add_column(c, justify="right")
    for n, rep, preempted in points:
        rows = [t for s in rep.sessions for t in s.turns]
        last = max((t.turn for t in rows if t.ttft_s is not None), default=0)
        ttfts = [t.ttft_s for t in rows if t.turn == last and t.ttft_s is not None]
        worst = max((t.gap_max_s for t in rows if t.gap_max_s is not None), default=None)
        i = rep.interference
        table.add_row(
            str(n),
            fmt_num(max(ttfts, default=None), ".2f"),
            fmt_num(min(ttfts, default=None), ".2f"),
            fmt_num(i.decode_tok_s_alone_median, ".1f"),
            fmt_num(i.decode_tok_s_during_foreign_prefill_median, ".1f"),
            fmt_num(worst, ".2f"),
            pct(rep.server.kv_peak),
            fmt_num(preempted, ".0f"),
            rep.run.status or "-",
        )
    console = Console(file=io.StringIO(), width=160, force_terminal=False, color_system=None)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def span_line(s: SpanFigures) -> str:
    """`engine spans (OTLP): 12 matched, 0 unmatched; agree with the per-request metrics within 0.3 ms`."""
    text = f"engine spans (OTLP): {s.matched} matched, {s.unmatched} unmatched"
    if s.refused:
        text += f", {s.refused} bad exports refused"
    if s.max_disagreement_ms is not None:
        text += f"; agree with the per-request metrics within {s.max_disagreement_ms:.2f} ms"
    return text
