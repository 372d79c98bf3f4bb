"""Prompts shaped like real users': a shared system prompt and prefix, real text from a corpus, and the
user's think time between turns, against the simulated engine (tests/test_prompt_shapes_vllm.py: the real
vLLM CPU server)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from rich.text import Text

from rampwatch.drivers.client.prompts import CorpusReader, read_corpus
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.prompt_shape import parse_think_time
from rampwatch.drivers.run.recording import Recording, read_recording
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.tui.widgets.sessions import session_row
from tests.conftest import ROOT, report_json, rw, small_run

SOURCES = ROOT / "drivers"  # this repository's own code: a corpus of real text


def recorded_run(url: str, record: Path, *extra: str, schedule: str = "2k,4k") -> Recording:
    """A short headless run against `url` with `extra` flags, recorded to `record`, read back."""
    p = rw(*small_run(url, "--record", str(record), *extra, schedule=schedule), timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return read_recording(record)


def turns_done(rec: Recording) -> dict[tuple[str, int], ev.TurnDone]:
    return {(e.session, e.turn): e for e in rec.events if isinstance(e, ev.TurnDone) and e.status == "ok"}


def sent(rec: Recording) -> dict[tuple[str, int], ev.RequestSent]:
    return {(e.session, e.turn): e for e in rec.events if isinstance(e, ev.RequestSent)}


def full_blocks(tokens: int, block: int) -> int:
    """What a prefix cache of `block`-token blocks can hold of `tokens` shared tokens."""
    return tokens // block * block


def unique_system_prompt() -> str:
    """A system prompt no earlier run sent (a server's prefix cache outlives a run)."""
    return f"You are a terse assistant ({uuid.uuid4()}). Answer with what is asked and nothing else.\n" * 8


def check_shared_lead_cached(rec: Recording, block: int) -> None:
    """Turn 1 of the second session found the whole shared lead (its full blocks) cached; the first did not."""
    shape = rec.header.prompts
    assert shape is not None and shape.lead_tokens > shape.shared_prefix_tokens > 0
    done = turns_done(rec)
    assert done["s1", 1].cached_tokens is not None and done["s1", 1].cached_tokens < block
    assert done["s2", 1].cached_tokens is not None
    assert done["s2", 1].cached_tokens >= full_blocks(shape.lead_tokens, block), (shape, done["s2", 1])


def check_targets(rec: Recording, within: float = 0.02) -> None:
    done = turns_done(rec)
    planned = sent(rec)
    assert done and len(done) == len(planned)
    for key, d in done.items():
        target = planned[key].target_tokens
        assert d.prompt_tokens is not None and abs(d.prompt_tokens - target) <= within * target, (key, d, target)


def test_system_prompt_and_shared_prefix_are_cached_on_the_second_sessions_first_turn(sim, tmp_path):
    system = tmp_path / "system.txt"
    system.write_text(unique_system_prompt())
    rec = recorded_run(
        sim.url,
        tmp_path / "lead.jsonl",
        "--sessions",
        "2",
        "--stagger",
        "1",
        "--system-prompt",
        f"@{system}",
        "--shared-prefix",
        "1k",
    )
    check_shared_lead_cached(rec, make_profile("tiny").block_size)
    check_targets(rec)
    assert all(t.needle for t in turns_done(rec).values())
    shape = rec.header.prompts
    assert shape is not None and shape.system_prompt is None  # its size and hash, not its text
    assert shape.system_prompt_chars == len(system.read_text()) and len(shape.system_prompt_sha256) == 64
    assert shape.shared_prefix_tokens == 1024 and shape.shared_prefix_measured == 1024
    report = rw("report", str(tmp_path / "lead.jsonl"))
    assert "prompts: system prompt" in report.stdout and "shared prefix 1,024 tokens" in report.stdout


def test_the_system_prompt_text_is_recorded_only_with_record_text(sim, tmp_path):
    rec = recorded_run(sim.url, tmp_path / "text.jsonl", "--system-prompt", "Be brief.", "--record-text")
    assert rec.header.prompts is not None and rec.header.prompts.system_prompt == "Be brief."


def test_corpus_text_lands_every_turn_within_2_percent(sim, tmp_path):
    rec = recorded_run(
        sim.url,
        tmp_path / "corpus.jsonl",
        "--corpus",
        str(SOURCES),
        "--sessions",
        "2",
        "--record-text",
        schedule="2k,4k,8k,16k",
    )
    check_targets(rec)
    corpus = read_corpus(SOURCES)
    shape = rec.header.prompts
    assert shape is not None and shape.corpus == str(SOURCES) and shape.corpus_files == corpus.files > 10
    messages = {key: e.text or "" for key, e in sent(rec).items()}
    for (session, turn), text in messages.items():
        # The new text is the corpus's (a stretch of it, read on), the salt still leads turn 1, the needle is asked.
        assert text[len(text) // 4 : len(text) // 4 + 200] in corpus.text  # (turn 1: before the fact)
        assert "Question: what is the access code of" in text
        assert turn > 1 or f"-{session}] " in text[:40]
    assert messages["s1", 2][:500] != messages["s2", 2][:500]  # each session reads its own place
    assert all(t.needle for t in turns_done(rec).values())


def test_a_corpus_wraps_around_at_its_end(tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta ")
    (tmp_path / "b.bin").write_bytes(b"\0\1\2binary")
    (tmp_path / "c.txt").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8: skipped
    corpus = read_corpus(tmp_path)
    assert corpus.files == 1 and corpus.text == "alpha beta "
    reader = CorpusReader(corpus, 6)
    assert reader.text(12) == "beta alpha b" and reader.text(3) == "eta"


@pytest.mark.serial  # the next turn sent within 0.5 s of its pause's end
def test_think_time_pauses_between_a_reply_and_the_next_turn(sim, tmp_path):
    rec = recorded_run(sim.url, tmp_path / "think.jsonl", "--think-time", "2s..4s", schedule="1k,2k,3k")
    done, planned = turns_done(rec), sent(rec)
    pauses = {e.turn: e for e in rec.events if isinstance(e, ev.UserPause)}
    assert sorted(pauses) == [2, 3]
    for turn in (2, 3):
        gap = planned["s1", turn].t - done["s1", turn - 1].t
        assert 2.0 <= pauses[turn].seconds <= 4.0 and pauses[turn].seconds <= gap <= pauses[turn].seconds + 0.5, gap
    assert rec.header.prompts is not None and rec.header.prompts.think_time_s == (2.0, 4.0)
    rows = report_json(tmp_path / "think.jsonl")["sessions"][0]["turns"]
    assert rows[0]["think_s"] is None and 2.0 <= rows[1]["think_s"] <= 4.0
    assert "think time 2s..4s (median pause" in rw("report", str(tmp_path / "think.jsonl")).stdout


def test_a_think_time_range_may_start_at_zero(sim, tmp_path):
    """0s..1s: some users answer at once; the range is taken, and every pause lies in it."""
    rec = recorded_run(sim.url, tmp_path / "zero.jsonl", "--think-time", "0s..1s", schedule="1k,2k,3k")
    assert rec.header.prompts is not None and rec.header.prompts.think_time_s == (0.0, 1.0)
    pauses = [e.seconds for e in rec.events if isinstance(e, ev.UserPause)]
    assert len(pauses) == 2 and all(0.0 <= s <= 1.0 for s in pauses), pauses


def test_a_think_time_of_zero_is_no_pause(sim, tmp_path):
    """0s alone: no pause, as without the flag (nothing in the header, no pause event)."""
    assert parse_think_time("0s") is None and parse_think_time("0") is None and parse_think_time("0s..0s") is None
    assert parse_think_time("0s..30s") == (0.0, 30.0) and parse_think_time("5s") == (5.0, 5.0)
    rec = recorded_run(sim.url, tmp_path / "none.jsonl", "--think-time", "0s")
    assert rec.header.prompts is None and not any(isinstance(e, ev.UserPause) for e in rec.events)


def test_lockstep_waits_at_the_barrier_then_each_session_pauses_its_own_time(sim, tmp_path):
    rec = recorded_run(
        sim.url, tmp_path / "both.jsonl", "--sessions", "2", "--lockstep", "--think-time", "1s..2s", schedule="1k,2k"
    )
    done, planned = turns_done(rec), sent(rec)
    pauses = {e.session: e for e in rec.events if isinstance(e, ev.UserPause)}
    barrier = max(done["s1", 1].t, done["s2", 1].t)
    for sid in ("s1", "s2"):
        assert pauses[sid].t >= barrier - 1e-6  # the pause starts once both finished turn 1
        assert planned[sid, 2].t >= barrier + pauses[sid].seconds
    assert pauses["s1"].seconds != pauses["s2"].seconds  # each its own draw


def test_the_sessions_panel_shows_the_users_pause_as_the_users():
    state = RunState()
    state.apply(ev.SessionPlanned(t=0.0, session="s1", schedule=[1000, 2000], salt="x"))
    state.apply(ev.RequestSent(t=0.1, session="s1", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=10))
    state.apply(ev.TurnDone(t=1.0, session="s1", turn=1, status="ok", prompt_tokens=1000, completion_tokens=8))
    state.apply(ev.UserPause(t=1.0, session="s1", turn=2, seconds=12.0))
    s = state.sessions["s1"]
    assert s.state == "user idle" and s.user_idle(4.5) == pytest.approx(3.5)
    row = session_row(s, 4.5, 100)
    assert isinstance(row, Text) and "user idle 3.50s" in row.plain and "reasoning" not in row.plain
    state.apply(ev.RequestSent(t=13.0, session="s1", turn=2, target_tokens=2000, new_tokens_est=990, body_bytes=10))
    assert s.state == "prefilling" and s.user_idle(14.0) is None and s.current and s.current.think_s == 12.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--corpus", "missing/"), "--corpus missing: no such file or directory"),
        (("--think-time", "-1"), "--think-time: not a duration: '-1'"),
        (("--think-time", "5s..2s"), "the range must go from the shorter pause to the longer"),
        (("--think-time", "0s.."), "--think-time: not a duration: ''"),
        (("--shared-prefix", "abc"), "--shared-prefix: not a token count: 'abc'"),
        (("--system-prompt", "@missing.txt"), "--system-prompt @missing.txt: No such file or directory"),
    ],
)
@pytest.mark.parametrize("command", ["run", "demo"])
def test_bad_prompt_shapes_are_one_line_and_exit_2(command, flags, message):
    args = ["run", "http://127.0.0.1:9", "--headless", "--no-record"] if command == "run" else ["demo", "--headless"]
    p = rw(*args, *flags)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert message in p.stderr and "Traceback" not in p.stderr


def test_a_shared_lead_too_big_for_the_first_turn_is_refused(sim):
    p = rw(*small_run(sim.url, "--no-record", "--shared-prefix", "4k"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "cannot hold the shared lead" in p.stderr


def test_sweep_takes_the_prompt_shape_flags(sim, tmp_path):
    p = rw(
        "sweep",
        sim.url,
        "--sessions",
        "1",
        "--schedule",
        "1k,2k",
        "--output-tokens",
        "8",
        "--gpu",
        "none",
        "--corpus",
        str(SOURCES),
        "--think-time",
        "0.2s",
        "--shared-prefix",
        "200",
        "--record",
        str(tmp_path / "sweep.json"),
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    point = next(tmp_path.glob("*.jsonl"))
    shape = read_recording(point).header.prompts
    assert shape is not None and shape.corpus == str(SOURCES) and shape.think_time_s == (0.2, 0.2)
