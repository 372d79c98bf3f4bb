"""Several runs side by side: the campaign's cross-model table and the TTFT of
every turn, each figure taken from the run's own report (so `compare` and
`report --format json` can never disagree)."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.stats import median
from rampwatch.drivers.model.turn_row import TurnRow
from rampwatch.drivers.present.turn_table import served_cell

COMPARE_SCHEMA = 7  # the JSON comparison's schema (docs/replay.md: "rampwatch compare"); bump on any change
NO_HIT_COUNTERS = "n/a: engine exposes no prefix-cache counters"


class RunRow(msgspec.Struct):
    """One recording. Multi-session runs give their slowest session's figures."""

    label: str
    path: str
    engine: str
    engine_version: str
    model: str
    sessions: int
    lockstep: bool
    turns_completed: int
    turns_planned: int
    context_reached: int | None
    slowest_session_ttft_sum_s: float | None  # the largest of the sessions' summed TTFTs
    session_ttft_sums_s: list[float]  # every ramp session's summed TTFT, in session order
    ttft_max_s: float | None  # the longest single wait
    last_turn_ttft_s: float | None  # the slowest session's last turn
    one_shot_ttft_s: float | None
    prefill_tok_s_first_turn: float | None  # median over sessions
    prefill_tok_s_last_turn: float | None
    decode_tok_s_median: float | None
    hit_rate_last_turn: float | str | None  # a fraction, or why it is not available
    kv_peak: float | None
    needle_found: int
    needle_asked: int
    needle_no_answer: int  # turns cut at the token cap before any answer (reasoning models)
    ttfa_max_s: float | None  # the longest time to the first answer token
    reasoning_tokens: int  # summed over every session's turns
    worst_gap_during_foreign_prefill_s: float | None
    failed_turns: int
    # The slowest session's summed engine queue and prefill time (None: the engine timed no turn).
    slowest_session_queued_sum_s: float | None = None
    slowest_session_engine_prefill_sum_s: float | None = None
    slowest_session_front_end_sum_s: float | None = None  # ... and its server front end (None: no engine spans)
    # --slo: the SLO, the turns that met it and their rate (the goodput); --arrivals: turns sent late (None: none).
    slo: str | None = None
    slo_turns_met: int | None = None
    slo_turns_met_per_min: float | None = None
    late_turns: int | None = None
    slo_conversations_met: int | None = None  # conversations every turn of which met it
    slo_conversations_met_per_min: float | None = None
    cache_efficiency: float | None = None  # --trace: cached over the prompt tokens the trace allowed (None: no trace)
    # Behind a router: the share of turns served by their session's first backend, and the sessions that moved
    # (None: no turn's backend was told).
    affinity: float | None = None
    moved_sessions: int | None = None


class ComparedTurn(msgspec.Struct):
    """Turn k of every run: the slowest session's TTFT, its ratio to the baseline run's, how the engine
    accounted for that TTFT (queued, engine prefill and the server's front end; None where the engine did not
    time it) and the same session's time to the first answer token."""

    turn: int
    ttft_s: list[float | None]
    ratio_to_baseline: list[float | None]
    queued_s: list[float | None]
    engine_prefill_s: list[float | None]
    front_end_s: list[float | None]
    ttfa_s: list[float | None]
    served_by: list[str | None] = []  # the backend that served that same turn ("ambiguous"; None: none told)


class Comparison(msgspec.Struct):
    schema: int
    baseline: str  # the label the ratios divide by
    runs: list[RunRow]
    turns: list[ComparedTurn]
    notes: list[str]


def _slowest_by_turn(rep: Report) -> dict[int, TurnRow]:
    """Turn k's row of the session that waited longest for it."""
    out: dict[int, TurnRow] = {}
    for s in rep.sessions:
        for t in s.turns:
            if t.ttft_s is not None and t.error is None and (t.turn not in out or t.ttft_s > out[t.turn].ttft_s):
                out[t.turn] = t
    return out


def run_row(label: str, path: str, rep: Report, engine_version: str, planned_schedule: list[int]) -> RunRow:
    sessions = rep.sessions
    rows = [t for s in sessions for t in s.turns]
    ok = [t for t in rows if t.error is None and t.ttft_s is not None]
    last_turn = max((t.turn for t in ok), default=0)
    worst = max(sessions, key=lambda s: s.summary.ttft_sum_s, default=None)
    by_turn = _slowest_by_turn(rep)
    first_rates = [t.prefill_tok_s for t in ok if t.turn == 1 and t.prefill_tok_s is not None]
    last_rates = [t.prefill_tok_s for t in ok if t.turn == last_turn and t.prefill_tok_s is not None]
    hit: float | str | None = rep.server.hit_rate_last_turn
    if hit is None and ok:
        hit = NO_HIT_COUNTERS
    gaps = rep.interference.gaps_during_foreign_prefill
    return RunRow(
        label=label,
        path=path,
        engine=rep.run.engine,
        engine_version=engine_version,
        model=rep.run.model,
        sessions=rep.run.sessions,
        lockstep=rep.run.lockstep,
        turns_completed=len(ok),
        turns_planned=len(planned_schedule) * len(sessions),
        context_reached=max((t.context_tokens for t in ok), default=None),
        slowest_session_ttft_sum_s=worst.summary.ttft_sum_s if worst else None,
        session_ttft_sums_s=[s.summary.ttft_sum_s for s in sessions],
        ttft_max_s=max((s.summary.ttft_max_s for s in sessions), default=None),
        last_turn_ttft_s=by_turn[last_turn].ttft_s if last_turn in by_turn else None,
        one_shot_ttft_s=rep.one_shot.turn.ttft_s if rep.one_shot else None,
        prefill_tok_s_first_turn=median(first_rates),
        prefill_tok_s_last_turn=median(last_rates),
        decode_tok_s_median=median([t.decode_tok_s for t in ok if t.decode_tok_s is not None]),
        hit_rate_last_turn=hit,
        kv_peak=rep.server.kv_peak,
        needle_found=sum(s.summary.needle_found for s in sessions),
        needle_asked=len(ok),
        needle_no_answer=sum(s.summary.needle_no_answer for s in sessions),
        ttfa_max_s=max((t.ttfa_s for t in ok if t.ttfa_s is not None), default=None),
        reasoning_tokens=sum(s.summary.reasoning_tokens for s in sessions),
        worst_gap_during_foreign_prefill_s=gaps.max_s if gaps else None,
        failed_turns=sum(1 for t in rows if t.error is not None and t.error != "cancelled"),
        slowest_session_queued_sum_s=worst.summary.queued_sum_s if worst else None,
        slowest_session_engine_prefill_sum_s=worst.summary.engine_prefill_sum_s if worst else None,
        slowest_session_front_end_sum_s=worst.summary.front_end_sum_s if worst else None,
        slo=rep.goodput.slo if rep.goodput else None,
        slo_turns_met=rep.goodput.turns_met if rep.goodput else None,
        slo_turns_met_per_min=rep.goodput.turns_met_per_min if rep.goodput else None,
        slo_conversations_met=rep.goodput.conversations_met if rep.goodput else None,
        slo_conversations_met_per_min=rep.goodput.conversations_met_per_min if rep.goodput else None,
        late_turns=rep.open_loop.late_turns if rep.open_loop else None,
        cache_efficiency=rep.reuse.run.efficiency if rep.reuse else None,
        affinity=rep.affinity.share if rep.affinity else None,
        moved_sessions=rep.affinity.moved_sessions if rep.affinity else None,
    )


def compare(runs: list[tuple[str, str, Report, str, list[int]]], baseline: int = 0) -> Comparison:
    """`runs`: (label, path, report, engine version, schedule) each; ratios divide by run `baseline`."""
    rows = [run_row(*r) for r in runs]
    per_run = [_slowest_by_turn(rep) for _, _, rep, _, _ in runs]
    turns = sorted({k for d in per_run for k in d})
    base = per_run[baseline]
    columns = []
    for k in turns:
        slowest = [d.get(k) for d in per_run]
        ttfts = [t.ttft_s if t else None for t in slowest]
        b = base[k].ttft_s if k in base else None
        columns.append(
            ComparedTurn(
                turn=k,
                ttft_s=ttfts,
                ratio_to_baseline=[t / b if t is not None and b else None for t in ttfts],
                queued_s=[t.queued_s if t else None for t in slowest],
                engine_prefill_s=[t.engine_prefill_s if t else None for t in slowest],
                front_end_s=[t.ttft_front_end_s if t else None for t in slowest],
                ttfa_s=[t.ttfa_s if t else None for t in slowest],
                served_by=[served_cell(t) if t and t.served_by_source else None for t in slowest],
            )
        )
    notes = []
    schedules = {tuple(r[4]) for r in runs}
    if len(schedules) > 1:
        notes.append("the runs' schedules differ: turns are compared by index, not by context size")
    return Comparison(schema=COMPARE_SCHEMA, baseline=rows[baseline].label, runs=rows, turns=columns, notes=notes)
