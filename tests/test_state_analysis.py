"""RunState and analysis on hand-built event lists."""

from __future__ import annotations

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import panels
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turns import hit_rate


def header() -> ev.Header:
    return ev.Header(
        rampwatch_version="t",
        command=["rampwatch"],
        mode="run",
        server="http://s",
        model="m",
        engine="vllm",
        sessions=2,
    )


def fold(events: list[ev.AnyEvent]) -> RunState:
    s = RunState(header())
    for e in events:
        s.apply(e)
    return s


def metrics(t: float, **values: float) -> ev.MetricsSample:
    return ev.MetricsSample(t=t, source="m", engine="vllm", values=values)


def turn_ok(
    t: float, session: str, turn: int, prompt_tokens: int, cached_tokens: int | None, tokens: int, needle: bool = True
) -> ev.TurnDone:
    """A turn that ended well, its `tokens` tokens streamed in as many chunks."""
    counts = dict(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, completion_tokens=tokens, chunks=tokens)
    return ev.TurnDone(t=t, session=session, turn=turn, status="ok", needle=needle, **counts)


def two_session_run() -> list[ev.AnyEvent]:
    """s1 decodes 1 token/s alone, then at 0.25 tokens/s while s2 prefills; s2 then decodes."""
    e: list[ev.AnyEvent] = [
        ev.SessionPlanned(t=0, session="s1", schedule=[1000, 2000], salt="a"),
        ev.SessionPlanned(t=0, session="s2", schedule=[1000, 2000], salt="b"),
        metrics(0.0, kv_usage=0.0, prefix_queries=0, prefix_hits=0),
        ev.RequestSent(t=0.0, session="s1", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=4000),
        ev.FirstToken(t=2.0, session="s1", turn=1),
        ev.TokenTimes(t=6.0, session="s1", turn=1, times=[2.0, 3.0, 4.0, 5.0, 6.0]),  # alone: 1/s
        ev.RequestSent(t=6.5, session="s2", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=4000),
        metrics(7.0, kv_usage=0.4, prefix_queries=2000, prefix_hits=0),
        ev.TokenTimes(t=22.0, session="s1", turn=1, times=[10.0, 14.0, 18.0, 22.0]),  # during s2's prefill: 0.25/s
        turn_ok(22.0, "s1", 1, prompt_tokens=1010, cached_tokens=0, tokens=9),
        ev.FirstToken(t=23.0, session="s2", turn=1),
        ev.TokenTimes(t=26.0, session="s2", turn=1, times=[23.0, 24.0, 25.0, 26.0]),
        turn_ok(26.0, "s2", 1, prompt_tokens=990, cached_tokens=None, tokens=4, needle=False),
    ]
    return e


def test_states_follow_the_turn():
    events = two_session_run()
    s = fold(events[:5])
    assert s.sessions["s1"].state == "decoding" and s.sessions["s2"].state == "queued"
    s = fold(events[:7])
    assert s.sessions["s2"].state == "prefilling"
    assert [r.session for r in s.prefilling()] == ["s2"]
    s = fold(events)
    assert s.sessions["s1"].state == "idle" and s.sessions["s2"].state == "idle"
    assert s.sessions["s1"].needles == [True] and s.sessions["s2"].needles == [False]
    assert s.sessions["s1"].context_tokens == 1010


def test_turn_rows_follow_the_measurement_rules():
    rep = build_report(fold(two_session_run()))
    s1 = rep.sessions[0].turns[0]
    assert s1.ttft_s == 2.0
    assert s1.decode_tok_s == pytest.approx((9 - 1) / (22.0 - 2.0))
    assert s1.prefill_tok_s == pytest.approx(1010 / 2.0)
    assert s1.hit_rate == 0.0 and s1.kv_peak == 0.4 and s1.needle is True
    s2 = rep.sessions[1].turns[0]
    assert s2.ttft_s == pytest.approx(16.5)
    assert s2.cached_tokens is None and s2.new_tokens == 990
    assert rep.sessions[0].summary.needle_found == 1 and rep.sessions[1].summary.needle_found == 0


def test_interference_split():
    rep = build_report(fold(two_session_run()))
    i = rep.interference
    # s1: intervals 2->6 alone (4 of 1 s), 6->10 ends after s2's send at 6.5: foreign; 10->22 foreign (3 of 4 s).
    assert i.overlapping_turns == 1
    assert i.decode_tok_s_during_foreign_prefill_median == pytest.approx(4 / 16.0)
    # alone: s1's four 1-s intervals and s2's three (s1 was not prefilling then).
    assert i.decode_tok_s_alone_median == pytest.approx(1.0)


def test_hit_rate_from_counter_deltas_without_usage():
    s = fold(
        [
            ev.SessionPlanned(t=0, session="s1", schedule=[100], salt="a"),
            metrics(0.0, prefix_queries=1000, prefix_hits=100),
            ev.RequestSent(t=0.1, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1),
            metrics(0.5, prefix_queries=1400, prefix_hits=400),
            ev.TurnDone(t=1.0, session="s1", turn=1, status="ok", prompt_tokens=400, completion_tokens=1),
        ]
    )
    assert hit_rate(s.turns[0]) == pytest.approx(300 / 400)


def test_counter_reset_skips_the_interval():
    s = fold(
        [
            metrics(0, prefix_queries=1000, prefix_hits=500),
            metrics(1, prefix_queries=10, prefix_hits=5),
            metrics(2, prefix_queries=110, prefix_hits=55),
        ]
    )
    # The restart interval adds nothing; afterwards deltas resume (counters read as growth since the first answer).
    assert panels.counters(s)["prefix_queries"] == 100
    assert panels.hit_rate_since_start(s) == pytest.approx(50 / 100)


def sample(t: float, source: str, **values: float) -> ev.MetricsSample:
    return ev.MetricsSample(t=t, source=source, engine="vllm", values=values)


def test_a_server_that_answers_late_adds_none_of_its_history():
    """Server b first answers 30 s into the run, with a day of traffic behind it:
    the since-start figures count only what it did after it answered."""
    a = [
        sample(t, "a", prefix_queries=1000 + 100 * t, prefix_hits=500 + 50 * t, generation_tokens=10 * t, running=1)
        for t in range(0, 61, 10)
    ]
    b = [
        sample(
            t, "b", prefix_queries=9e6 + 100 * t, prefix_hits=8.9e6 + 90 * t, generation_tokens=5e6 + 20 * t, running=2
        )
        for t in range(30, 61, 10)
    ]
    s = fold(sorted(a + b, key=lambda e: e.t))
    # a: 6000 queries, 3000 hits, 600 generated; b from t=30: 3000 queries, 2700 hits, 600 generated.
    assert panels.counters(s) == {"prefix_queries": 9000, "prefix_hits": 5700, "generation_tokens": 1200}
    assert panels.hit_rate_since_start(s) == pytest.approx(5700 / 9000)
    assert s.endpoints["b"].hit_rate_since_start() == pytest.approx(0.9)
    assert s.endpoints["b"].first_sample_t == 30
    assert s.server.values["running"] == 3
    assert s.server.rates["generation_tokens"] == pytest.approx(30.0)  # 10 + 20 tokens/s
    without_b = fold(a)
    assert panels.counters(s)["generation_tokens"] - panels.counters(without_b)["generation_tokens"] == 600


def test_kv_usage_over_endpoints_is_the_share_of_all_pools_and_fits_is_per_engine():
    s = fold(
        [
            ev.SessionPlanned(t=0, session="s1", schedule=[100_000], salt="a", endpoint="a"),
            ev.SessionPlanned(t=0, session="s2", schedule=[200_000], salt="b", endpoint="b"),
            ev.RequestSent(t=0.1, session="s1", turn=1, target_tokens=100_000, new_tokens_est=100_000, body_bytes=1),
            ev.RequestSent(t=0.1, session="s2", turn=1, target_tokens=200_000, new_tokens_est=200_000, body_bytes=1),
            # b runs two data-parallel engines of 500K tokens each: "fits" divides one engine's pool.
            sample(1, "a", kv_usage=0.5, kv_capacity_tokens=1_000_000, kv_engine_tokens=1_000_000),
            sample(1, "b", kv_usage=0.1, kv_capacity_tokens=1_000_000, kv_engine_tokens=500_000),
        ]
    )
    assert s.server.values["kv_usage"] == pytest.approx(0.3)
    assert s.server.values["kv_capacity_tokens"] == 2_000_000
    assert panels.kv_fits(s) == 2  # b: 500K / 200K; a would fit 10


def test_a_split_deployment_says_where_a_turn_is():
    h = header()
    h.endpoints = [ev.Endpoint(name="p", role="prefill"), ev.Endpoint(name="d", role="decode")]
    s = RunState(h)
    for e in [
        ev.SessionPlanned(t=0, session="s1", schedule=[1000], salt="a"),
        ev.RequestSent(t=0.1, session="s1", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=1),
        sample(0.2, "p", running=1, waiting=0),
        sample(0.2, "d", running=0, waiting=0),
    ]:
        s.apply(e)
    assert panels.turn_place(s, s.sessions["s1"]) == ("prefill", "p")
    s.apply(sample(0.3, "p", running=0, waiting=0))
    s.apply(sample(0.3, "d", running=0, waiting=1))
    assert panels.turn_place(s, s.sessions["s1"]) == ("transfer", "d")
    s.apply(ev.FirstToken(t=0.4, session="s1", turn=1))
    assert panels.turn_place(s, s.sessions["s1"]) == ("decode", "d")


def test_unavailable_metric_stays_unavailable():
    s = fold(
        [
            ev.MetricsSample(
                t=0,
                source="m",
                engine="llama.cpp",
                values={"running": 1.0},
                missing={"kv_usage": "llama.cpp exposes no KV-cache occupancy"},
            )
        ]
    )
    assert "kv_usage" not in s.server.values
    assert "llama.cpp" in s.server.missing["kv_usage"]
    assert panels.hit_rate_since_start(s) is None


def test_failed_turn_and_log():
    s = fold(
        [
            ev.SessionPlanned(t=0, session="s1", schedule=[100, 200], salt="a"),
            ev.RequestSent(t=0, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1),
            ev.TurnDone(t=1, session="s1", turn=1, status="failed", error="HTTP 500: boom"),
        ]
    )
    assert s.sessions["s1"].state == "failed" and s.sessions["s1"].failed_turns == 1
    assert s.log[-1].level == "error" and "HTTP 500: boom" in s.log[-1].text
    assert build_report(s).sessions[0].turns[0].error == "HTTP 500: boom"


def test_decode_rate_now_uses_a_window():
    s = fold(
        [
            ev.SessionPlanned(t=0, session="s1", schedule=[100], salt="a"),
            ev.RequestSent(t=0, session="s1", turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1),
            ev.FirstToken(t=1, session="s1", turn=1),
            ev.TokenTimes(t=10, session="s1", turn=1, times=[1.0, 2.0] + [9.0 + k * 0.1 for k in range(11)]),
        ]
    )
    assert s.sessions["s1"].decode_rate_now() == pytest.approx(10.0)


def test_new_log_entries():
    s = fold(two_session_run())
    total = s.log.total
    assert s.log.new_since(total) == []
    assert s.log.new_since(total - 2) == list(s.log)[-2:]


def test_foreign_prefill_cells_shade_other_sessions_only():
    s = fold(two_session_run())
    # s2 prefilled over [6.5, 23.0): for s1 the cells 6..22 are shaded; for s2 only s1's prefill [0, 2.0).
    cells = panels.foreign_prefill_cells(s, "s1", 0.0, 1.0, 30, now=30.0)
    assert [i for i, c in enumerate(cells) if c] == list(range(6, 23))
    own = panels.foreign_prefill_cells(s, "s2", 0.0, 1.0, 30, now=30.0)
    assert [i for i, c in enumerate(own) if c] == [0, 1]


def test_inter_token_gaps_split_alone_and_during_a_foreign_prefill():
    rep = build_report(fold(two_session_run()))
    s1 = rep.sessions[0]
    row = s1.turns[0]
    # Four 1 s gaps alone, then four 4 s gaps while s2 prefilled.
    assert (row.gap_p50_s, row.gap_max_s, row.gaps_over_100ms, row.gaps_over_1s) == (2.5, 4.0, 8, 4)
    assert s1.summary.gaps_alone.max_s == 1.0 and s1.summary.gaps_during_foreign_prefill.max_s == 4.0
    assert rep.interference.gaps_during_foreign_prefill.max_s == 4.0
    assert rep.turn_spread[0].ratio == pytest.approx(16.5 / 2.0)


def test_the_gap_split_matches_its_definition_over_many_sessions():
    """A gap counts as during a foreign prefill when, at the token that ends it, another session's request was sent
    and had no first token yet (its span open, or closed later). Checked against that definition directly over 12
    seeded sessions of staggered turns, batches of token times and turns that fail before their first token."""
    import random

    rng = random.Random(7)
    events: list[ev.AnyEvent] = []
    spans: dict[str, list[tuple[float, float]]] = {}  # every session's [sent, first-or-end) prefills
    tokens: dict[tuple[str, int], list[float]] = {}
    for k in range(12):
        sid, t = f"s{k}", rng.uniform(0, 3)
        events.append(ev.SessionPlanned(t=0.0, session=sid, schedule=[1000] * 4, salt="x"))
        for turn in range(1, 5):
            first = t + rng.uniform(0.2, 2.5)
            events.append(
                ev.RequestSent(t=t, session=sid, turn=turn, target_tokens=1000, new_tokens_est=500, body_bytes=1)
            )
            if rng.random() < 0.15:  # failed while prefilling: the span ends with the turn
                events.append(ev.TurnDone(t=first, session=sid, turn=turn, status="error", error="boom"))
                spans.setdefault(sid, []).append((t, first))
                t = first + rng.uniform(0, 1)
                continue
            spans.setdefault(sid, []).append((t, first))
            events.append(ev.FirstToken(t=first, session=sid, turn=turn))
            times = [first, *sorted(first + rng.uniform(0, 3) for _ in range(19))]  # the first token's stamp too
            tokens[(sid, turn)] = times
            for b in range(0, 20, 5):  # batches of five, sent at their last stamp
                events.append(ev.TokenTimes(t=times[b + 4], session=sid, turn=turn, times=times[b : b + 5]))
            events.append(turn_ok(times[-1], sid, turn, 1000, 500, 20))
            t = times[-1] + rng.uniform(0, 0.5)
    state = fold(sorted(events, key=lambda e: e.t))

    def foreign(sid: str, at: float) -> bool:
        return any(a <= at < b for o, ss in spans.items() if o != sid for a, b in ss)

    checked = 0
    for rec in state.turns:
        if (rec.session, rec.turn) not in tokens:
            continue
        ts = tokens[(rec.session, rec.turn)]
        during = [b - a for a, b in zip(ts, ts[1:]) if foreign(rec.session, b)]
        alone = [b - a for a, b in zip(ts, ts[1:]) if not foreign(rec.session, b)]
        assert sorted(rec.gaps_during) == pytest.approx(sorted(during)), (rec.session, rec.turn)
        assert sorted(rec.gaps_alone) == pytest.approx(sorted(alone)), (rec.session, rec.turn)
        checked += bool(during) and bool(alone)
    assert checked >= 5  # turns with gaps of both kinds, so neither side is vacuous


def _histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over (le, cumulative count) pairs: linear inside the bucket the rank falls in."""
    total = buckets[-1][1]
    rank, lower, below = q * total, 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            return lower + (le - lower) * (rank - below) / (cum - below)
        lower, below = le, cum
    raise AssertionError("rank past the last bucket")


def test_the_exporter_counts_the_gaps_the_report_counts():
    """Chunks stamped in one read (zero gaps) are one delivery to the report and to the gap histogram alike, so
    Prometheus's p50 gap and the report's agree (here the median sits on a bucket edge, where they are equal)."""
    from rampwatch.drivers.telemetry.client_metrics import GAP_BUCKETS
    from tests.folding import fold as fold_exported

    events: list[ev.AnyEvent] = [
        ev.SessionPlanned(t=0, session="s1", schedule=[1000], salt="a"),
        ev.RequestSent(t=0.0, session="s1", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=4000),
        ev.FirstToken(t=1.0, session="s1", turn=1),
        ev.TokenTimes(t=1.04, session="s1", turn=1, times=[1.0, 1.0, 1.015, 1.015, 1.04]),  # zero, 0.015, zero, 0.025
        ev.TokenTimes(t=1.08, session="s1", turn=1, times=[1.04, 1.055, 1.08]),  # zero across the batches, 0.015, 0.025
        turn_ok(1.1, "s1", 1, prompt_tokens=1000, cached_tokens=0, tokens=8),
    ]
    state, exporter = fold_exported(None, events, run="r")
    gaps = build_report(state).sessions[0].summary.gaps_alone
    assert gaps is not None and gaps.count == 4

    def sample(name: str, **labels: str) -> float:
        value = exporter.registry.get_sample_value(name, {"session": "s1", "run": "r", **labels})
        assert value is not None, (name, labels)
        return value

    assert sample("rampwatch_inter_token_gap_seconds_count") == gaps.count
    buckets = [(le, sample("rampwatch_inter_token_gap_seconds_bucket", le=str(float(le)))) for le in GAP_BUCKETS]
    assert _histogram_quantile(0.5, buckets) == pytest.approx(gaps.p50_s, rel=1e-9)
    assert gaps.p50_s == pytest.approx(0.02, rel=1e-9)


def test_a_stamp_standing_for_several_chunks_folds_as_those_chunks_do():
    """A fast stream's read carries many chunks under one kernel stamp: recorded once with its count, it folds to
    the same turn (chunks, gaps, decode rate, the report) as one stamp per chunk; a shard's shift or a demo's
    time factor moves the stamps and keeps the counts."""
    import msgspec

    from rampwatch.drivers.model.modelled import modelled, shifted

    def run(*batches: ev.TokenTimes) -> list[ev.AnyEvent]:
        return [
            ev.SessionPlanned(t=0, session="s1", schedule=[1000], salt="a"),
            ev.RequestSent(t=0.0, session="s1", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=4000),
            ev.FirstToken(t=1.0, session="s1", turn=1),
            *batches,
            turn_ok(1.1, "s1", 1, prompt_tokens=1000, cached_tokens=0, tokens=8),
        ]

    each = run(
        ev.TokenTimes(t=1.04, session="s1", turn=1, times=[1.0, 1.0, 1.015, 1.015, 1.04]),
        ev.TokenTimes(t=1.08, session="s1", turn=1, times=[1.04, 1.055, 1.08]),
    )
    counted = run(
        ev.TokenTimes(t=1.04, session="s1", turn=1, times=[1.0, 1.015, 1.04], counts=[2, 2, 1]),
        ev.TokenTimes(t=1.08, session="s1", turn=1, times=[1.04, 1.055, 1.08]),
    )
    a, b = fold(each), fold(counted)
    assert a.turns[0].chunks == b.turns[0].chunks == 8
    assert list(a.turns[0].gaps_alone) == list(b.turns[0].gaps_alone)
    assert msgspec.to_builtins(build_report(a)) == msgspec.to_builtins(build_report(b))
    batch = counted[3]
    assert isinstance(batch, ev.TokenTimes)
    assert shifted(batch, 2.0).chunk_times() == pytest.approx([3.0, 3.0, 3.015, 3.015, 3.04])
    assert modelled(batch, 10.0).chunk_times() == pytest.approx([10.0, 10.0, 10.15, 10.15, 10.4])
    assert msgspec.json.decode(msgspec.json.encode(batch), type=ev.AnyEvent) == batch  # as recorded, and read back
    torn = b'{"type":"TokenTimes","session":"s1","turn":1,"times":[1.0,1.015],"counts":[2],"t":1.015}'
    with pytest.raises(msgspec.ValidationError, match="1 counts for 2 times"):  # a corrupt line, never a short count
        msgspec.json.decode(torn, type=ev.AnyEvent)
