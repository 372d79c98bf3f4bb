"""One home per figure: on one recording, the Prometheus exporter's series, the live header's tally, the Sessions
panel and the report agree on the turns that met the SLO, the late turns, each session's hit rate and the
inter-token gaps, because all of them read the one fold (drivers/model/state.py) and the turn's own figures."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.present.format import pct
from rampwatch.drivers.run.recording import read_recording
from rampwatch.tui.widgets.header import header_text
from rampwatch.tui.widgets.sessions import session_row
from tests.folding import fold, sample

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "recordings").glob("*.sample.jsonl"))
KNEE = ROOT / "recordings" / "sim-knee-160pm.sample.jsonl"  # open loop, --slo: 15 of 42 turns met it


def knee_with_late_turns_and_a_warmup() -> tuple[ev.Header, list[ev.AnyEvent]]:
    """The shipped knee point with every third turn due 50 ms before it was sent (late) and --warmup 3: late
    turns, turns left out, conversations spoilt by the warmup, all on a real run's figures."""
    rec = read_recording(KNEE)
    events: list[ev.AnyEvent] = []
    k = 0
    for e in rec.events:
        if isinstance(e, ev.RequestSent) and e.due is not None:
            k += 1
            if k % 3 == 0:
                e = msgspec.structs.replace(e, due=e.t - 0.05)
        events.append(e)
    return msgspec.structs.replace(rec.header, warmup="3"), events


def vllm_without_cached_tokens() -> tuple[ev.Header, list[ev.AnyEvent]]:
    """The shipped vLLM CPU run as a server without --enable-prompt-tokens-details reports it: no cached tokens in
    usage, so every hit rate comes from the prefix-cache counters over the turn."""
    rec = read_recording(ROOT / "recordings" / "vllm-cpu-2x32k.sample.jsonl")
    strip = [msgspec.structs.replace(e, cached_tokens=None) if isinstance(e, ev.TurnDone) else e for e in rec.events]
    return rec.header, strip


def cases() -> list[tuple[str, ev.Header, list[ev.AnyEvent]]]:
    out = []
    for path in SHIPPED:
        rec = read_recording(path)
        out.append((path.name, rec.header, rec.events))
    return [
        *out,
        ("knee, late turns and --warmup 3", *knee_with_late_turns_and_a_warmup()),
        ("vllm-cpu, hit rates from the counters", *vllm_without_cached_tokens()),
    ]


@pytest.mark.parametrize(("name", "header", "events"), cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_the_exporter_the_live_tally_the_panel_and_the_report_agree(name, header, events):
    state, exporter = fold(header, events)
    rep = build_report(state)
    sessions = [s.id for s in rep.sessions]
    assert sessions, name

    def total(series: str) -> float:
        return sum(sample(exporter, series, s) for s in state.sessions)

    now = state.t
    head = header_text(state, now, "replay", None).plain
    # Turns that met the SLO (past the warmup), and the conversations that met it on every turn.
    g = rep.goodput
    if g is not None:
        assert f"SLO met {g.turns_met}/{g.turns} turns" in head, head
        assert f"{g.conversations_met} conv" in head, head
        assert total("rampwatch_slo_met_turns_total") == g.turns_met
        assert total("rampwatch_slo_met_conversations") == g.conversations_met
        verdicts = [t.slo_met for s in rep.sessions for t in s.turns]
        assert all(v is not None for v in verdicts)  # every ramp turn judged, the warmup's too
    else:
        assert "SLO met" not in head and total("rampwatch_slo_met_turns_total") == 0
    # Late turns (past the warmup): the report's, the header's, the exporter's.
    late = rep.open_loop.late_turns if rep.open_loop is not None else 0
    assert total("rampwatch_late_turns_total") == late == state.late_turns
    if rep.open_loop is not None:
        assert f"{late} late" in head, head
    # Each session's hit rate: its last finished turn's, in the report, the Sessions panel and the exporter.
    for s in rep.sessions:
        view = state.sessions[s.id]
        hit = s.turns[-1].hit_rate if s.turns else None
        assert view.hit_rate == hit
        assert pct(hit) in session_row(view, now, 200).plain.split()
        served = exporter.registry.get_sample_value("rampwatch_hit_rate", {"session": s.id, "run": ""})
        assert served == (pytest.approx(hit) if hit is not None else None)
    # Inter-token gaps: every delivery gap the report counts is in the exporter's histogram, and the stalls too.
    gaps = [x for x in (rep.interference.gaps_alone, rep.interference.gaps_during_foreign_prefill) if x]
    ramp_gaps = sum(
        sample(exporter, "rampwatch_inter_token_gap_seconds_count", s) for s in state.sessions if s in sessions
    )
    assert ramp_gaps == sum(x.count for x in gaps)
    over = sum(
        sample(exporter, "rampwatch_inter_token_gap_seconds_count", s)
        - sample(exporter, "rampwatch_inter_token_gap_seconds_bucket", s, le="0.1")
        for s in sessions
    )
    assert over == sum(x.over_100ms for x in gaps)
    # And the report's TTFTs are the histogram's.
    ttfts = [t.ttft_s for s in rep.sessions for t in s.turns if t.ttft_s is not None]
    served = sum(sample(exporter, "rampwatch_ttft_seconds_sum", s) for s in sessions)
    assert served == pytest.approx(sum(ttfts))


def test_the_counters_case_really_reads_its_hit_rates_from_the_counters():
    state, _ = fold(*vllm_without_cached_tokens())
    done = [r for r in state.turns if r.status == "ok"]
    assert all(r.cached_tokens is None for r in done) and {s.hit_rate for s in state.sessions.values()} - {None}


def test_the_warmup_case_really_has_late_turns_left_out_and_counted():
    """The constructed case exercises what the agreement test is for: some late turns are counted, some fall in
    the warmup and are not, and the warmup spoils its conversations."""
    header, events = knee_with_late_turns_and_a_warmup()
    state, _ = fold(header, events)
    late = [r for r in state.turns if r.late]
    assert state.late_turns == sum(1 for r in late if not r.in_warmup) > 0
    assert any(r.in_warmup for r in late)
    rep = build_report(state)
    assert rep.goodput is not None and rep.goodput.warmup_turns > 0
    assert re.search(r"SLO met \d+/\d+ turns", header_text(state, state.t, "replay", None).plain)
