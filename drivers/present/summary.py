"""The lines under a report's tables: what the run's figures say in words (interference, the engine's
own account, the client's check, open-loop arrivals and goodput, the prompts), shared by `report`, the
report screen and the exported picture."""

from __future__ import annotations

from typing import Any

import msgspec

from rampwatch.drivers.model.analysis import Report, SessionSummary, SpanFigures
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.events import PromptShape
from rampwatch.drivers.model.gaps import GapStats
from rampwatch.drivers.model.reuse import ReuseTally
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turn_row import TurnRow
from rampwatch.drivers.present.client_workers import client_worker_lines, worker_lines
from rampwatch.drivers.present.format import fmt_num, format_tokens, pct
from rampwatch.drivers.present.routing import affinity_lines, move_note, router_lines
from rampwatch.drivers.present.turn_text import REST_UNSPLIT, engine_timing_hint


def needle_count(found: int, asked: int, no_answer: int) -> str:
    """found/asked, and how many of those turns were cut before any answer."""
    return f"{found}/{asked}" + (f" ({no_answer} no answer)" if no_answer else "")


EACH_SESSION_MAX = 64  # more sessions (a trace's thousands) get one line for all: the report has each one's table


def summary_lines(rep: Report) -> list[str]:
    lines = []
    if len(rep.sessions) > EACH_SESSION_MAX:
        turns = sum(len(s.turns) for s in rep.sessions)
        lines.append(
            f"{counted(len(rep.sessions), 'session')}, {counted(turns, 'turn')}: each one's table in `rampwatch report`"
        )
    for s in rep.sessions if len(rep.sessions) <= EACH_SESSION_MAX else ():
        m = s.summary
        reached = f", reached turn {m.reached_turn}/{m.planned_turns}" if m.reached_turn < m.planned_turns else ""
        answered = any(t.ttfa_s is not None for t in s.turns)
        # A trace's turns carry no needle: no "needle 0/N" for a question never asked.
        asked = any(t.needle is not None or t.no_answer for t in s.turns)
        needle = f", needle {needle_count(m.needle_found, m.turns, m.needle_no_answer)}" if asked else ""
        reasoned = f", reasoning {m.reasoning_tokens:,} tok" if m.reasoning_tokens else ""
        if reasoned and answered:
            reasoned += f", time to first answer sum {m.ttfa_sum_s:.2f}s"
        lines.append(
            f"{s.id}: {counted(m.turns, 'turn')}{reached}, TTFT sum {m.ttft_sum_s:.2f}s, longest {m.ttft_max_s:.2f}s, "
            f"decode median {fmt_num(m.decode_tok_s_median, '.1f')} tok/s" + needle + reasoned + _engine_sums(m)
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
    elif rest := rest_line(turns):
        lines.append(rest)
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
        worst = f"event-loop lag worst {rep.client_lag_max_ms:.0f} ms"
        of_busy = ""
        if rep.client_lag_own_max_ms is not None:  # the machine's late wakes told apart from the driver's own work
            worst += f" (its own work {rep.client_lag_own_max_ms:.1f} ms at most, the rest the machine's)"
            of_busy = f", {sum(t.client_busy_own for t in turns):,} by its own work"
        lines.append(
            f"client: {worst}; {busy:,} of {counted(len(turns), 'turn')} client busy{of_busy} "
            "(a stamp taken while it ran over 5 ms late)"
        )
    lines += client_worker_lines(rep)  # --workers N: each worker's loop, its CPU and the turns it marked
    lines += worker_lines(rep)  # ... where they ran, their clocks, any worker lost
    lines += open_loop_lines(rep)
    lines += reuse_lines(rep)
    lines += affinity_lines(rep) + router_lines(rep)
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
        warm = f" (past the warmup, {o.warmup})" if o.warmup else ""
        lag = f" (worst {o.send_lag_max_s * 1000:.0f} ms)" if o.send_lag_max_s is not None else ""
        ttft = (
            f"; TTFT p50 {o.ttft_from_due_p50_s:.2f}s from due, {o.ttft_from_send_p50_s:.2f}s from send"
            if o.ttft_from_due_p50_s is not None and o.ttft_from_send_p50_s is not None
            else ""
        )
        source = f"the trace at {o.trace_speed:g}x" if o.trace_speed is not None else f"seed {o.seed}"
        rate = f"{round(o.arrivals_per_min, 2):g}/min" if o.arrivals_per_min else "all at once"
        lines.append(
            f"arrivals: {rate} ({source}){cap}, {o.arrived} arrived; "
            f"{counted(o.late_turns, 'turn')}{warm} sent over 10 ms late{lag}{ttft}"
        )
    if g is not None:
        per_min = f", {g.turns_met_per_min:.2f} turns/min" if g.turns_met_per_min is not None else ""
        conv_min = f", {g.conversations_met_per_min:.2f}/min" if g.conversations_met_per_min is not None else ""
        lines.append(
            f"goodput (SLO {g.slo}): {g.turns_met:,} of {counted(g.turns, 'turn')} met it{per_min}; "
            f"{g.conversations_met} of {g.conversations} conversations met it on every turn{conv_min}"
            + (f"; warmup: {g.warmup} left out ({counted(g.warmup_turns, 'turn')})" if g.warmup else "")
        )
    return lines


def _efficiency(tally: ReuseTally) -> float:
    return tally.efficiency if tally.efficiency is not None else 2.0  # unknown last


def reuse_lines(rep: Report) -> list[str]:
    """--trace: the prefix-cache reuse the server delivered against what the trace allowed, and where it fell short."""
    r = rep.reuse
    if r is None:
        return []
    run = r.run
    pool = (
        f"; {pct(run.efficiency_pool)} of what an LRU pool of {rep.run.trace.kv_tokens:,} tokens could keep"
        if run.efficiency_pool is not None and rep.run.trace is not None and rep.run.trace.kv_tokens
        else ""
    )
    lines = [
        f"reuse: cached {run.cached_tokens:,} of the {run.ideal_tokens:,} prompt tokens the trace allowed "
        f"(cache efficiency {pct(run.efficiency)}){pool}"
    ]
    if len(r.sessions) > 1 or r.endpoints:
        # A trace's thousands of sessions: the endpoints and the sessions least efficient, not every one.
        sessions = r.sessions if len(r.sessions) <= EACH_SESSION_MAX else sorted(r.sessions, key=_efficiency)[:5]
        parts = [f"{t.name} {pct(t.efficiency)}" for t in (*r.endpoints, *sessions)]
        if len(sessions) < len(r.sessions):
            parts.append(f"(the 5 least of {len(r.sessions):,} sessions)")
        lines.append("reuse by " + ("endpoint and session: " if r.endpoints else "session: ") + ", ".join(parts))
    if r.shortfalls:
        worst = ", ".join(
            f"{s.session} turn {s.turn} {pct(s.hit_rate)} hit of {pct(s.ideal_hit_rate)} possible"
            + move_note(rep, s.session, s.turn)
            for s in r.shortfalls[:5]
        )
        lines.append(f"reuse fell furthest below ideal on: {worst}")
    return lines


def _engine_sums(m: SessionSummary) -> str:
    """The engine's own account summed over a session's turns, where it gave one."""
    if m.engine_prefill_sum_s is None:
        return ""
    queued = f"queued {m.queued_sum_s:.2f}s, " if m.queued_sum_s is not None else ""
    text = f"; engine: {queued}prefill {m.engine_prefill_sum_s:.2f}s"
    if m.front_end_sum_s is not None and m.client_sum_s is not None:
        text += f", front end {m.front_end_sum_s:.2f}s; client {m.client_sum_s:.3f}s"
    return text


def rest_line(turns: list[TurnRow]) -> str | None:
    """The rest of the timed turns' TTFTs: split into the server's front end and the client's side (medians),
    or why it is not (the engine's spans are missing)."""
    split = [t for t in turns if t.ttft_front_end_s is not None and t.ttft_client_s is not None]
    if not split:
        return REST_UNSPLIT if any(t.ttft_rest_s is not None for t in turns) else None
    front = median([t.ttft_front_end_s for t in split if t.ttft_front_end_s is not None])
    client = median([t.ttft_client_s for t in split if t.ttft_client_s is not None])
    return (
        f"rest of the TTFT ({counted(len(split), 'turn')} with the engine's own TTFT): server front end median "
        f"{fmt_num(None if front is None else front * 1000, '.1f')} ms, client median "
        f"{fmt_num(None if client is None else client * 1000, '.1f')} ms"
    )


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


def span_line(s: SpanFigures) -> str:
    """`engine spans (OTLP): 12 matched, 0 unmatched; agree with the per-request metrics within 0.3 ms`."""
    text = f"engine spans (OTLP): {s.matched} matched, {s.unmatched} unmatched"
    if s.refused:
        text += f", {s.refused} bad exports refused"
    if s.max_disagreement_ms is not None:
        text += f"; agree with the per-request metrics within {s.max_disagreement_ms:.2f} ms"
    return text
