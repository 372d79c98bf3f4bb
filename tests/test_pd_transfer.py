"""A prefill/decode split: KV the decode server received from the prefill server is `transferred`, not
`cached` (issue 19): against rampwatch's simulated split and a real vLLM pair, run as a user runs them."""

from __future__ import annotations

import pytest

from rampwatch.drivers.present.turn_text import log_text
from tests.conftest import report_json, rw, sim_process


def test_a_simulated_split_reports_transferred_kv_apart_from_prefix_cache_reuse(tmp_path):
    """Turn 1 has nothing to reuse: all its KV came from the prefill server. Later turns reuse the earlier
    context from the decode server's own prefix cache and receive only the rest."""
    # `rampwatch sim --pd` on three consecutive ports: the proxy's, then the prefill and decode servers'.
    with sim_process("--pd", "--profile", "tiny", "--time-scale", "1", ports=3) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        rec = tmp_path / "pd.jsonl"
        flags = f"--metrics-url prefill:prefill=http://127.0.0.1:{port + 1}/metrics"
        flags += f" --metrics-url decode:decode=http://127.0.0.1:{port + 2}/metrics --scrape-interval 0.05"
        flags += " --sessions 2 --lockstep --scale-to 16k --output-tokens 128 --ignore-eos --gpu none --headless"
        p = rw("run", f"http://127.0.0.1:{port}", *flags.split(), "--record", str(rec), timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = report_json(rec)
    for s in rep["sessions"]:
        turns = s["turns"]
        assert len(turns) == 10 and not any(t["error"] for t in turns)
        first = turns[0]
        assert first["cached_tokens"] <= 0.02 * first["context_tokens"], first
        assert first["transferred_tokens"] >= 0.95 * first["context_tokens"], first
        assert first["hit_rate"] <= 0.02
        for prev, t in zip(turns, turns[1:]):
            # The decode server holds the previous turn's prompt and reply: that much is reused, the rest moves.
            assert 0.8 * prev["context_tokens"] <= t["cached_tokens"] <= t["context_tokens"], t
            assert t["transferred_tokens"] <= t["context_tokens"] - t["cached_tokens"], t
            assert t["hit_rate"] == t["cached_tokens"] / t["context_tokens"]
        # rampwatch's proxy says how long each prefill leg took: the rest of the TTFT is the transfer's.
        for t in turns:
            assert 0 < t["prefill_leg_s"] < t["ttft_s"], t
            assert t["transfer_s"] == pytest.approx(t["ttft_s"] - t["prefill_leg_s"], abs=1e-9)
    dec = next(x for x in rep["servers"] if x["role"] == "decode")
    turns = [t for s in rep["sessions"] for t in s["turns"]]
    assert dec["transferred_tokens"] == sum(t["transferred_tokens"] for t in turns)
    assert next(x for x in rep["servers"] if x["role"] == "prefill")["transferred_tokens"] == 0
    # The Events line (here the headless line) and the report's table say both.
    for s in rep["sessions"]:
        first = s["turns"][0]
        line = f"{s['id']} turn 1 "
        assert f"cached {first['cached_tokens']:,}  transferred {first['transferred_tokens']:,}" in next(
            x for x in p.stdout.splitlines() if line in x
        )
    assert "| cached | transferred |" in rw("report", str(rec), "--format", "md").stdout


def test_an_unsplit_server_reports_no_transferred_kv(tmp_path):
    """Outside a split nothing is transferred: the field stays null and the column is not shown."""
    rec = tmp_path / "one.jsonl"
    flags = "--profile tiny --time-scale 1 --scale-to 4k --output-tokens 8 --headless"
    p = rw("demo", *flags.split(), "--record", str(rec), timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = report_json(rec)
    assert all(t["transferred_tokens"] is None for s in rep["sessions"] for t in s["turns"])
    assert "transferred" not in rw("report", str(rec)).stdout


def fold_split(events: list) -> list:
    """The turns a RunState folds from `events` behind a split (a prefill and a decode endpoint)."""
    from rampwatch.drivers.model import events as ev
    from rampwatch.drivers.model.state import RunState
    from rampwatch.drivers.model.turn_row import turn_row

    state = RunState()
    for e in events:
        state.apply(e)
    state.apply(ev.RunEnded(t=99.0, status="done", exit_code=0))
    return state, [turn_row(r) for r in state.turns]


def sample(t: float, role: str, transferred: float, prompt: float):
    from rampwatch.drivers.model import events as ev

    values = {"prompt_tokens": prompt, "prefix_queries": prompt, "prefix_hits": 0.0, "kv_transferred": transferred}
    return ev.MetricsSample(t=t, source=role, engine="vllm", values=values, role=role)


def turn(sid: str, t: float, prompt: int, cached: int) -> list:
    from rampwatch.drivers.model import events as ev

    return [
        ev.RequestSent(t=t, session=sid, turn=1, target_tokens=prompt, new_tokens_est=prompt, body_bytes=1),
        ev.FirstToken(t=t + 0.5, session=sid, turn=1),
        ev.TurnDone(t=t + 0.6, session=sid, turn=1, status="ok", prompt_tokens=prompt, cached_tokens=cached),
    ]


def test_two_turns_in_one_scrape_window_share_the_transfer_by_prompt_and_wait_for_the_scrape():
    """Both turns sent after one scrape and done before the next: the decode server's counter grew by both
    transfers; each turn gets its share, and its Events line comes with the scrape that covers it."""
    start = [sample(0.0, "prefill", 0, 0), sample(0.0, "decode", 0, 0)]
    state, rows = fold_split(
        [*start, *turn("s1", 1.0, 1000, 999), *turn("s2", 1.1, 3000, 2999), sample(2.0, "decode", 3998, 4000)]
    )
    assert [(r.cached_tokens, r.transferred_tokens) for r in rows] == [(0, 999), (0, 2999)]
    lines = [log_text(x) for x in state.log if "turn 1" in log_text(x)]
    assert len(lines) == 2 and all(x.t == 2.0 for x in state.log if "turn 1" in log_text(x))
    assert "cached 0  transferred 999" in lines[0]


def test_a_turn_attributed_earlier_is_not_counted_again_in_a_later_window():
    """s1's turn was attributed at the scrape after its first token; s2's window began before that scrape,
    so it holds s1's transfer too: s1's share comes off, and s2's own prefix-cache reuse is what is left."""
    start = [sample(0.0, "prefill", 0, 0), sample(0.0, "decode", 0, 0)]
    events = [
        *start,
        *turn("s1", 1.0, 1000, 999)[:2],
        sample(1.6, "decode", 999, 1000),
        turn("s1", 1.0, 1000, 999)[2],
        *turn("s2", 1.2, 2000, 1999)[:2],  # sent before the 1.6 scrape
        sample(2.0, "decode", 999 + 500, 3000),
        turn("s2", 1.2, 2000, 1999)[2],
        sample(2.5, "decode", 999 + 500, 3000),
    ]
    _, rows = fold_split(events)
    by = {r.turn: r for r in rows}
    assert [(r.cached_tokens, r.transferred_tokens) for r in rows] == [(0, 999), (1499, 500)], by


def test_a_sample_that_does_not_show_the_turn_yet_is_waited_past():
    """vLLM may publish a turn's admission a scrape after its first token reached the client (CI: a real pair's
    turn 7 kept no figure once): the first sample after the first token still counts nothing of it, so the turn
    waits for the next sample rather than giving up."""
    start = [sample(0.0, "prefill", 0, 0), sample(0.0, "decode", 0, 0)]
    state, rows = fold_split(
        [*start, *turn("s1", 1.0, 1000, 999), sample(1.7, "decode", 0, 0), sample(2.0, "decode", 999, 1000)]
    )
    assert [(r.cached_tokens, r.transferred_tokens) for r in rows] == [(0, 999)]
    assert [x.t for x in state.log if "turn 1" in log_text(x)] == [2.0]  # its line came with the sample that showed it


def test_outside_a_split_nothing_is_transferred():
    from rampwatch.drivers.model import events as ev

    one = ev.MetricsSample(
        t=0.0, source="one", engine="vllm", values={"prompt_tokens": 0.0, "kv_transferred": 0.0}, role="both"
    )
    _, rows = fold_split([one, *turn("s1", 1.0, 1000, 500)])
    assert (rows[0].cached_tokens, rows[0].transferred_tokens, rows[0].hit_rate) == (500, None, 0.5)


def test_turns_given_transfer_never_add_up_to_more_than_the_counters_grew():
    """One session's turns, each counted a scrape late (CI: a real pair's turns added up to 114 tokens more than
    the decode server's counter grew): turn 2's window opens at a sample that does not show turn 1 yet, so it
    holds turn 1's transfer too. Turn 2 waits for a sample that can hold its own admission, and gets what the
    counters grew by beyond turn 1's share."""
    from rampwatch.drivers.model import events as ev

    start = [sample(0.0, "prefill", 0, 0), sample(0.0, "decode", 0, 0)]
    one = [*turn("s1", 1.0, 1000, 999)]
    two = [
        ev.RequestSent(t=1.75, session="s1", turn=2, target_tokens=2000, new_tokens_est=1000, body_bytes=1),
        ev.FirstToken(t=2.25, session="s1", turn=2),
        ev.TurnDone(t=2.35, session="s1", turn=2, status="ok", prompt_tokens=2000, cached_tokens=1999),
    ]
    events = [
        *start,
        *one,
        sample(1.7, "decode", 0, 0),  # after turn 1's first token, yet without it
        two[0],
        sample(1.9, "decode", 999, 1000),
        *two[1:],
        sample(2.4, "decode", 999, 1000),  # after turn 2's first token, yet without it
        sample(2.6, "decode", 999 + 300, 1000 + 2000),
    ]
    state, rows = fold_split(events)
    assert [(r.turn, r.cached_tokens, r.transferred_tokens) for r in rows] == [(1, 0, 999), (2, 1699, 300)]
    assert [x.t for x in state.log if "turn 2" in log_text(x)] == [2.6]


def test_a_restarted_decode_server_delays_no_turn_past_its_own_window():
    """The decode server restarts while s2 runs and loses what it counted before its next scrape: the counters
    since start then never hold every turn given. A turn whose own window shows its admission is not held back
    by that: each later turn's line comes with the sample after it, as before the restart."""
    start = [sample(0.0, "prefill", 0, 0), sample(0.0, "decode", 0, 0)]
    events = [*start, *turn("s1", 1.0, 1000, 999), sample(1.7, "decode", 999, 1000)]
    events += [*turn("s2", 2.0, 1000, 999), sample(2.7, "decode", 500, 600)]  # restarted: its counters start over
    kv, prompt = 500, 600
    for k, sid in enumerate(("s3", "s4", "s5", "s6")):
        kv, prompt = kv + 999, prompt + 1000
        events += [*turn(sid, 3.0 + k, 1000, 999), sample(3.7 + k, "decode", kv, prompt)]
    state, rows = fold_split(events)
    assert [r.transferred_tokens for r in rows] == [999] * 6
    lines = [x.t for x in state.log if "turn 1" in log_text(x)]
    assert lines == [1.7, 3.7, 3.7, 4.7, 5.7, 6.7], lines  # s2's waits for a sample holding its admission
