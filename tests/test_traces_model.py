"""The trace model alone, on hand-worked cases: ideal reuse (unbounded and LRU), sessions assembled from rows
(keys, delays, parent chains and branches, bad rows), slicing, and `trace info`'s figures."""

from __future__ import annotations

import pytest

from rampwatch.drivers.model.trace import (
    BadRows,
    TraceProblem,
    TraceRequest,
    collect_sessions,
    derived_hash_ids,
)
from rampwatch.drivers.model.trace_reuse import IdealReuse, LruPrefixCache, annotate_ideal, held_blocks
from rampwatch.drivers.model.trace_sessions import SessionAssembly, TraceRow, assemble
from rampwatch.drivers.model.trace_slice import SliceCounts, TraceSlice, slice_requests
from rampwatch.drivers.model.trace_stats import TraceStats


def req(session: str, ids: list[int], input_length: int, due: float = 0.0, turn: int = 1, **kw) -> TraceRequest:
    return TraceRequest(
        session=session,
        turn=turn,
        due_s=due,
        input_length=input_length,
        output_length=kw.pop("out", 10),
        hash_ids=ids,
        **kw,
    )


def ideal(requests: list[TraceRequest], block: int, pool: int | None = None) -> list[tuple[int, int | None]]:
    reuse = IdealReuse(block, pool)
    return [reuse.observe(r) for r in requests]


# ---- ideal reuse


def test_unbounded_reuse_is_the_longest_run_of_leading_blocks_already_sent():
    rs = [
        req("a", [1, 2, 3], 30),
        req("b", [1, 2, 4], 30),  # shares 1, 2
        req("c", [1, 5, 3], 30),  # 3 was sent, but after a miss: a prefix, not a set
        req("d", [7, 2, 3], 30),  # nothing leads
        req("e", [1, 2, 4, 9], 40),
    ]
    assert [u for u, _ in ideal(rs, 10)] == [0, 20, 10, 0, 30]


def test_a_partial_last_block_is_never_cached_nor_counted():
    rs = [
        req("a", [1, 2, 3], 25),  # block 3 holds 5 tokens: partial, not kept
        req("a", [1, 2, 3], 30, turn=2),  # 3 is full now, but was never sent full
        req("b", [1, 2, 3], 30),  # found whole: all but its last token, which an engine always computes
        req("c", [1, 2, 3], 29),  # 2 full blocks; its partial third is not counted though 3 is held
    ]
    assert [u for u, _ in ideal(rs, 10)] == [0, 20, 29, 20]


def test_ideal_never_exceeds_the_input_rounded_down_to_a_block():
    rs = [req("a", list(range(10)), 100), req("b", list(range(10)), 95)]
    assert [u for u, _ in ideal(rs, 10, pool=1000)] == [0, 90]
    assert [p for _, p in ideal(rs, 10, pool=1000)] == [0, 90]


def test_lru_pool_falls_below_unbounded_exactly_where_eviction_took_the_prefix():
    """A pool of 4 blocks of 10 tokens, worked by hand (its freed blocks, least recently freed first; X a block
    nothing will find: a partial one, a reply's):
    r1 [1,2,3]     30 tokens, reply 1: a miss; takes 3 never-used blocks, frees them tail first: [3, 2, 1]
    r2 [1,2,7]     25 tokens (7 partial), reply 16: hits 1,2 (20); holds 4 blocks by its end (25 + 15 tokens): the
                   last never-used one, then evicts 3; frees [X, X, 2, 1]
    r3 [1,2,3,4]   unbounded 1,2,3 (30); r2's reply took 3: 1,2 (20); its 2 new blocks evict the Xs: [4, 3, 2, 1]
    r4 [9]         10 tokens, reply 11: holds 2 blocks, evicting 4 then 3, the tail first: [2, 1, X, 9]
    r5 [1,2,3,4,5] unbounded 1,2,3,4 (40); the pool 1,2 (20)"""
    rs = [
        req("a", [1, 2, 3], 30, out=1),
        req("b", [1, 2, 7], 25, out=16),
        req("a", [1, 2, 3, 4], 40, turn=2, out=1),
        req("c", [9], 10, out=11),
        req("a", [1, 2, 3, 4, 5], 50, turn=3, out=1),
    ]
    assert ideal(rs, 10, pool=40) == [(0, 0), (20, 20), (30, 20), (0, 0), (40, 20)]
    assert [p for _, p in ideal(rs, 10, pool=1000)] == [0, 20, 30, 0, 40]  # a pool large enough is unbounded
    assert ideal(rs, 10) == [(0, None), (20, None), (30, None), (0, None), (40, None)]


def test_a_request_holds_its_prompt_and_its_reply_but_the_last_token():
    assert held_blocks(req("a", [1, 2, 7], 25, out=16), 10) == 4  # 40 tokens
    assert held_blocks(req("a", [1, 2, 3], 30, out=1), 10) == 3  # the prompt alone
    assert held_blocks(req("a", [1, 2, 3], 30, out=2), 10) == 4  # and the first reply token


def test_lru_evicts_a_prefix_tail_before_its_head():
    """[1,2,3] is freed tail first, leaving 1 the most recently freed, so a newcomer evicts 3, and the prefix 1,2
    still hits (in prefix order, 1 would go first and the whole prefix would be lost)."""
    cache = LruPrefixCache(3)
    assert cache.send([1, 2, 3], 3, 3) == 0
    assert cache.send([9], 1, 1) == 0
    assert cache.send([1, 2, 3], 3, 3) == 2


def test_a_request_longer_than_the_pool_keeps_its_head():
    rs = [req("a", [1, 2, 3, 4], 40), req("b", [1, 2, 9], 30)]
    assert [p for _, p in ideal(rs, 10, pool=20)] == [0, 20]


def test_a_pool_smaller_than_a_block_holds_nothing():
    rs = [req("a", [1, 2], 20), req("b", [1, 2], 20)]
    assert ideal(rs, 10, pool=9) == [(0, 0), (19, 0)]  # b found whole: all but its last token


def test_annotate_ideal_sets_both_figures_on_each_request():
    rs = list(annotate_ideal([req("a", [1], 10), req("b", [1], 10)], 10, pool_tokens=10))
    assert [(r.ideal_cached, r.ideal_cached_pool) for r in rs] == [(0, 0), (9, 9)]  # b whole, less its last token


def test_derived_ids_share_a_sessions_prefix_and_nothing_else():
    t1, t2, other = derived_hash_ids(0, 40, 16), derived_hash_ids(0, 90, 16), derived_hash_ids(1, 40, 16)
    assert len(t1) == 3 and len(t2) == 6 and list(t2[:3]) == list(t1)
    assert not set(other) & set(t2)


# ---- sessions from rows


def row(line: int, inp: int, ids: list[int] | None = None, **kw) -> TraceRow:
    return TraceRow(line=line, input_length=inp, output_length=kw.pop("out", 10), hash_ids=ids, **kw)


def test_keyed_rows_make_sessions_and_a_delay_counts_from_the_sessions_previous_turn():
    rows = [
        row(1, 10, [1], due_s=100.0, sets_clock=True, session_key="a"),  # the first timestamp is the origin
        row(2, 20, [1, 2], delay_s=30.0, session_key="a"),  # due 30: held until the clock passes it
        row(3, 10, [5], due_s=110.0, sets_clock=True, session_key="b"),
        row(4, 10, [7], due_s=120.0, sets_clock=True),  # no key: a one-turn session
        row(5, 30, [1, 2, 3], delay_s=1.0, session_key="a"),
    ]
    out = list(assemble(rows, 10))
    assert [(r.session, r.turn, r.due_s) for r in out] == [
        ("a", 1, 0.0),
        ("b", 1, 10.0),
        ("row4", 1, 20.0),
        ("a", 2, 30.0),
        ("a", 3, 31.0),
    ]
    assert out[2].closes_session and not out[0].closes_session
    sessions = collect_sessions(out)
    assert [(s.id, [t.turn for t in s.turns]) for s in sessions] == [("a", [1, 2, 3]), ("b", [1]), ("row4", [1])]


def chain(line: int, chat: int, parent: int | None, t: float, inp: int = 10) -> TraceRow:
    ids = list(range(1, inp // 10 + 1))
    return row(
        line, inp, ids, due_s=t, sets_clock=True, row_id=str(chat), parent_id=None if parent is None else str(parent)
    )


def test_a_parent_chain_is_a_session_and_a_later_child_of_a_turn_is_a_branch():
    rows = [
        chain(1, 1, None, 0.0),
        chain(2, 2, 1, 1.0, 20),
        chain(3, 3, 2, 2.0, 30),  # 2's first child: the chain goes on
        chain(4, 4, 2, 3.0, 30),  # 2's second child: a branch, sharing the chain up to turn 2
        chain(5, 5, 4, 4.0, 40),  # continues the branch
        chain(6, 6, 1, 5.0, 20),  # another branch, from turn 1
    ]
    out = list(assemble(rows, 10))
    assert [(r.session, r.turn, r.forked_from, r.fork_turn) for r in out] == [
        ("1", 1, None, 0),
        ("1", 2, None, 0),
        ("1", 3, None, 0),
        ("4", 1, "1", 2),
        ("4", 2, None, 0),
        ("6", 1, "1", 1),
    ]


@pytest.mark.parametrize(
    ("rows", "reason", "said"),
    [
        ([chain(1, 1, None, 0.0), chain(2, 2, 7, 1.0)], "parent", "line 2: parent_chat_id 7 does not appear"),
        ([chain(1, 1, 1, 0.0)], "cycle", "line 1: chat_id 1 is its own parent"),
        ([chain(1, 1, None, 0.0), chain(2, 2, 1, 1.0), chain(3, 1, 2, 2.0)], "cycle", "would be its own ancestor"),
        ([chain(1, 1, None, 0.0), chain(2, 1, None, 1.0)], "duplicate", "line 2: chat_id 1 appears again"),
        (
            [chain(1, 1, None, 5.0), chain(2, 2, None, 3.0)],
            "order",
            "line 2: due at 3 s, before the trace's first row at 5 s",
        ),
        (
            [
                row(1, 10, [1], due_s=5.0, sets_clock=True),
                row(2, 10, [1], due_s=9.0, sets_clock=True),
                row(3, 10, [1], due_s=7.0, sets_clock=True),
            ],
            "order",
            "line 3: due at 2 s, before an earlier row's 4 s",
        ),
        ([row(1, 0, [], due_s=0.0)], "length", "line 1: input_length is 0"),
        ([row(1, 10, [1], due_s=0.0, out=-3)], "length", "output_length is -3"),
        ([row(1, 25, [1, 2], due_s=0.0)], "hash-ids", "2 hash ids for input_length 25, which at 10 tokens"),
        ([row(1, 10, [1], session_key="a")], "field", "session 'a' starts here without a timestamp"),
        (
            [row(1, 10, [1], due_s=0.0, session_key="a"), row(2, 10, [1], delay_s=-1.0, session_key="a")],
            "order",
            "delay is negative",
        ),
        (
            [
                row(1, 10, [1], due_s=0.0, session_key="a", closes_session=True),
                row(2, 10, [1], due_s=1.0, session_key="a"),
            ],
            "duplicate",
            "session 'a' appears again",
        ),
    ],
    ids=[
        "parent",
        "self-cycle",
        "cycle",
        "duplicate",
        "order",
        "order-clock",
        "zero",
        "negative",
        "hash-ids",
        "no-timestamp",
        "negative-delay",
        "reused-key",
    ],
)
def test_each_bad_row_is_one_problem_with_its_line_or_a_counted_skip(rows, reason, said):
    with pytest.raises(TraceProblem) as e:
        list(assemble(rows, 10))
    assert e.value.reason == reason and said in str(e.value), str(e.value)
    bad = BadRows(skip=True)
    list(assemble(rows, 10, bad))
    assert bad.counts == {reason: 1}


def test_a_skipped_row_leaves_nothing_behind_and_its_children_go_with_it():
    rows = [
        chain(1, 1, None, 0.0),
        row(2, 0, [], due_s=1.0, sets_clock=True, row_id="2", parent_id="1"),  # zero length: refused
        chain(3, 3, 2, 2.0),  # its child: refused, saying why
        chain(4, 4, 1, 3.0, 20),  # 1 is still its chain's last turn: it continues the chain
    ]
    bad = BadRows(skip=True)
    out = list(assemble(rows, 10, bad))
    assert [(r.session, r.turn, r.forked_from) for r in out] == [("1", 1, None), ("1", 2, None)]
    assert bad.counts == {"length": 1, "parent": 1}
    # Stopping at the child instead: its line says its parent was refused.
    assembly = SessionAssembly(10, BadRows(skip=True))
    list(assembly.add(rows[0]))
    list(assembly.add(rows[1]))
    assembly.bad = BadRows()
    with pytest.raises(TraceProblem, match="line 3: parent_chat_id 2 was refused above"):
        list(assembly.add(rows[2]))


def test_rows_are_given_back_in_due_order_as_soon_as_the_clock_passes_them():
    rows = [
        row(1, 10, [1], due_s=0.0, sets_clock=True, session_key="a"),
        row(2, 10, [1], delay_s=5.0, session_key="a"),  # due 5: waits
        row(3, 10, [2], due_s=3.0, sets_clock=True, session_key="b"),
    ]
    a = SessionAssembly(10)
    assert [r.line for r in a.add(rows[0])] == [1]
    assert [r.line for r in a.add(rows[1])] == []
    assert [r.line for r in a.add(rows[2])] == [3]
    assert a.order.waiting == 1
    assert [r.line for r in a.finish()] == [2]


# ---- slicing


def stream() -> list[TraceRequest]:
    """Session p: turns at 0, 10, 20, 30 (turn 2 is 900 tokens); session f forks from p after its turn 3, at
    25; session q: turns at 5, 35; a one-turn session z at 40."""
    return [
        req("p", [1], 10, 0.0, 1),
        req("q", [2], 10, 5.0, 1),
        req("p", [1], 900, 10.0, 2),
        req("p", [1], 10, 20.0, 3),
        req("f", [1], 10, 25.0, 1, forked_from="p", fork_turn=3),
        req("p", [1], 10, 30.0, 4),
        req("q", [2], 10, 35.0, 2),
        req("z", [3], 10, 40.0, 1),
    ]


def cut(**kw) -> tuple[list[tuple[str, int, float, str | None, int]], SliceCounts]:
    counts = SliceCounts()
    out = list(slice_requests(stream(), TraceSlice(**kw), counts))
    return [(r.session, r.turn, r.due_s, r.forked_from, r.fork_turn) for r in out], counts


def test_no_slice_passes_everything_as_it_is():
    out, counts = cut()
    assert len(out) == 8 and counts.counts == {} and not counts.ended


def test_max_context_counts_what_it_leaves_out_and_renumbers_the_rest():
    out, counts = cut(max_context=100)
    assert counts.counts == {"over-max-context": 1}
    assert [o for o in out if o[0] in ("p", "f")] == [
        ("p", 1, 0.0, None, 0),
        ("p", 2, 20.0, None, 0),  # the trace's turn 3
        ("f", 1, 25.0, "p", 2),  # forked after the trace's turn 3: the slice's turn 2
        ("p", 3, 30.0, None, 0),
    ]


def test_start_shifts_time_and_a_fork_from_before_it_stands_alone():
    out, counts = cut(start_s=12.0)
    assert counts.counts == {"before-start": 3}
    assert out[:2] == [("p", 1, 8.0, None, 0), ("f", 1, 13.0, "p", 1)]
    out, _ = cut(start_s=22.0)
    assert out[0] == ("f", 1, 3.0, None, 0)  # its parent's turns up to the fork were all before the start


def test_duration_stops_the_reading_and_sessions_keeps_the_first_n_to_start():
    out, counts = cut(start_s=5.0, duration_s=20.0)
    assert [o[:3] for o in out] == [("q", 1, 0.0), ("p", 1, 5.0), ("p", 2, 15.0)]
    assert counts.ended and counts.counts == {"before-start": 1}
    out, counts = cut(sessions=2)
    assert {o[0] for o in out} == {"p", "q"} and counts.counts == {"past-sessions": 2}


# ---- trace info's figures


def test_peak_live_context_growth_and_requests_per_minute_worked_by_hand():
    """a: 100+10 at 0, 200+10 at 10 (its last); b: 50+5 at 5 alone; c: 70+5 at 10, 80+5 at 20, 90+5 at 130.
    Live: 110 at 0; 165 at 5; at 10, a's 210 and c's 75 = 285 (the peak, two sessions); 85 at 20."""
    stats = TraceStats()
    for r in [
        req("a", [1], 100, 0.0, 1),
        req("b", [2], 50, 5.0, 1, out=5, closes_session=True),
        req("a", [1], 200, 10.0, 2, closes_session=True),
        req("c", [3], 70, 10.0, 1, out=5),
        req("c", [3], 80, 20.0, 2, out=5),
        req("c", [3], 90, 130.0, 3, out=5),
    ]:
        stats.add(r)
    info = stats.finish()
    assert (info.peak_live_tokens, info.peak_live_at_s, info.peak_live_sessions) == (285, 10.0, 2)
    assert info.requests_per_minute == [5, 0, 1]
    assert info.growth_per_turn is not None and (info.growth_per_turn.p50, info.growth_per_turn.max) == (10, 100)
    assert info.turns_per_session is not None and info.turns_per_session.max == 3
    assert (info.sessions, info.requests, info.span_s) == (3, 6, 130.0)
    assert info.context_tokens is not None and info.context_tokens.max == 200


def test_a_session_holds_its_context_between_its_requests():
    """a: 100 at 0 and 200 at 10; b: 500 at 5 alone. At 5, a still holds its first 100: 600, two sessions."""
    stats = TraceStats()
    for r in [
        req("a", [1], 100, 0.0, 1, out=0),
        req("b", [2], 500, 5.0, 1, out=0, closes_session=True),
        req("a", [1], 200, 10.0, 2, out=0),
    ]:
        stats.add(r)
    info = stats.finish()
    assert (info.peak_live_tokens, info.peak_live_at_s, info.peak_live_sessions) == (600, 5.0, 2)


def test_two_requests_of_a_session_at_one_instant_count_once_the_later():
    stats = TraceStats()
    for r in [req("a", [1], 100, 0.0, 1, out=0), req("a", [1], 300, 0.0, 2, out=0), req("b", [2], 10, 0.0, 1, out=0)]:
        stats.add(r)
    assert stats.finish().peak_live_tokens == 310


def test_ideal_hit_rates_are_cached_over_prompt_tokens():
    stats = TraceStats()
    for r in annotate_ideal([req("a", [1, 2], 20), req("b", [1, 2], 20), req("c", [9], 10)], 10, pool_tokens=10):
        stats.add(r)
    info = stats.finish(kv_tokens=10)
    assert (info.ideal_cached, info.prompt_tokens, info.ideal_hit_rate) == (19, 50, 0.38)  # b whole, less a token
    assert info.ideal_cached_pool == 10 and info.ideal_hit_rate_pool == 0.2 and info.forked_sessions == 0
