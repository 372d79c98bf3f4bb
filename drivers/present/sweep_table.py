"""A sweep's tables: the closed-loop curve (one row per session count) and the open-loop capacity curve (one
row per arrival rate, the knee a --find-max search found, and what the engine's KV pool would have said)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.capacity import CapacityPoint, kept_share
from rampwatch.drivers.present.format import fmt_num, pct

KV_SAME = 0.10  # the knee's live conversations within this fraction of the KV estimate read as about as many


def _text(table: Table) -> str:
    console = Console(file=io.StringIO(), width=160, force_terminal=False, color_system=None)
    console.print(table)
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
    return _text(table)


def render_capacity(
    points: list[CapacityPoint], slo_share: float | None = None, knee: float | None = None, fail: float | None = None
) -> str:
    """An open-loop sweep's curve, one row per rate (ascending); with a knee search (`slo_share` given) each row
    says whether it kept the share, and the lines under the table where the knee lies."""
    traced = any(p.trace_speed is not None for p in points)
    title = "one point per trace speed" if traced else "one point per arrival rate (open loop)"
    table = Table(title=f"sweep: {title}", title_justify="left")
    heads = ["speed"] if traced else []
    heads += ["offered /min", "turns /min", "goodput /min", "SLO met", "TTFT p50 s/128K", "p99 s/128K"]
    heads += ["waiting peak", "KV peak", "preemptions", "status"]
    for c in heads + (["verdict"] if slo_share is not None else []):
        table.add_column(c, justify="right")
    for p in sorted(points, key=lambda p: (p.trace_speed or 0, p.offered_per_min)):
        row = [f"{p.trace_speed:g}x" if p.trace_speed is not None else "-"] if traced else []
        row += [
            f"{p.offered_per_min:.4g}",
            fmt_num(p.turns_per_min, ".2f"),
            fmt_num(p.goodput_turns_per_min, ".2f"),
            pct(p.goodput_share),
            fmt_num(p.ttft_p50_per_128k_s, ".2f"),
            fmt_num(p.ttft_p99_per_128k_s, ".2f"),
            fmt_num(p.waiting_peak, ".0f"),
            pct(p.kv_peak),
            fmt_num(p.preemptions, ".0f"),
            p.status or "-",
        ]
        if slo_share is not None:
            row.append("kept" if kept_share(p, slo_share) else "missed")
        table.add_row(*row)
    out = _text(table)
    if (line := warmup_line(points)) is not None:
        out += line + "\n"
    if slo_share is not None:
        out += "\n".join(knee_lines(points, slo_share, knee, fail)) + "\n"
    return out


def warmup_line(points: list[CapacityPoint]) -> str | None:
    """What --warmup left out of each point's figures, in one line (None: nothing, at any point): once when every
    point left out the same, else rate by rate."""
    if not any(p.warmup for p in points):
        return None
    said = {p.warmup for p in points}
    if len(said) == 1:
        return f"warm-up left out of each point: {points[0].warmup}"
    ordered = sorted(points, key=lambda p: p.offered_per_min)
    return "warm-up left out: " + "; ".join(f"{p.offered_per_min:.4g}/min {p.warmup or 'none'}" for p in ordered)


def knee_lines(points: list[CapacityPoint], slo_share: float, knee: float | None, fail: float | None) -> list[str]:
    """Where the knee lies, how many conversations were live there (Little's law: rate x how long one lasted),
    and how that compares with the conversations the engine's KV pool holds at once."""
    slo = next((p.slo for p in points if p.slo), "?")
    if knee is None:
        low = min((p.offered_per_min for p in points), default=None)
        return [f"knee: below {fmt_num(low, '.4g')}/min: no rate tried kept {slo} for {pct(slo_share)} of turns"]
    if fail is None:
        return [f"knee: at or above {knee:.4g}/min: every rate tried kept {slo} for {pct(slo_share)} of turns"]
    at = next(p for p in points if p.offered_per_min == knee)
    lines = [
        f"knee: {knee:.4g}/min keeps {slo} for {pct(at.goodput_share)} of turns (at least {pct(slo_share)}); "
        f"{fail:.4g}/min does not: the knee is within {fail / knee:.3g}x of {knee:.4g}/min"
    ]
    if at.mean_conversation_s is not None:
        live = knee / 60 * at.mean_conversation_s
        fits = f"; the KV pool fits {at.kv_fits} such conversations at once" if at.kv_fits else ""
        lines.append(
            f"at the knee {live:.2g} conversations were live on average ({knee:.4g}/min x "
            f"{at.mean_conversation_s:.3g}s a conversation){fits}{kv_ratio(live, at.kv_fits)}"
        )
    return lines


def kv_ratio(live: float, fits: int | None) -> str:
    """How many times fewer (or more) conversations the knee keeps live than the KV estimate ('' without one);
    within KV_SAME of it, about as many."""
    if not fits or live <= 0:
        return ""
    if abs(fits - live) <= KV_SAME * live:
        return ": the knee keeps about as many live as the pool fits"
    ratio = fits / live if fits >= live else live / fits
    times = f"{ratio:.0f}" if ratio >= 10 else f"{ratio:.2g}"
    return f": the knee keeps {times}x {'fewer' if fits >= live else 'more'} live than the pool fits"
