"""Reasoning models: --reasoning, --max-tokens, reasoning and answer tokens, the time to the first answer token,
the 'no answer' needle and the reasoning session state, against the simulated engine's reasoning mode
(`rampwatch sim --reasoning-tokens N`) run as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rampwatch.drivers.client.chat import ChatStreamParser
from rampwatch.drivers.client.reasoning import reasoning_switches, with_reasoning
from rampwatch.drivers.client.session import resent_answer
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.views import NO_ANSWER
from rampwatch.drivers.present.turn_text import turn_line
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.headless import announcement
from rampwatch.drivers.run.recording import decode_event, read_recording
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.app import SimServer
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.tui.widgets.sessions import needle_marks, session_row
from tests.conftest import focus_table, report_json, rw, sim_process, small_run
from tests.simhost import CaptureRelay, ThreadedServer
from tests.test_request_options import chat_requests

THINK = 200  # the simulated model's reasoning tokens per reply
SCHEDULE = "2k,4k,8k"  # a re-sent 128-token stand-in for an empty answer would miss turn 2 by 3%
TARGETS = [2048, 4096, 8192]


@pytest.fixture(scope="module")
def reasoning_sim():
    """`rampwatch sim --reasoning-tokens 200` on a free port, as a user starts it."""
    with sim_process("--profile", "tiny", "--reasoning-tokens", str(THINK)) as (_, url):
        yield url


def reasoned_run(url: str, folder: Path, name: str, *extra: str) -> tuple[Path, dict]:
    """A headless, recorded run of SCHEDULE with --output-tokens 128 and `extra`; its recording and JSON report."""
    record = folder / f"{name}.jsonl"
    p = rw(*small_run(url, "--record", str(record), *extra, schedule=SCHEDULE, output_tokens=128))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return record, report_json(record)


@pytest.fixture(scope="module")
def runs(reasoning_sim, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The three runs the issue names: the server's default (it thinks, 128 tokens are not enough), thinking
    switched off, and thinking on with room to answer."""
    folder = tmp_path_factory.mktemp("reasoning-runs")
    return {
        "auto": reasoned_run(reasoning_sim, folder, "auto"),
        "off": reasoned_run(reasoning_sim, folder, "off", "--reasoning", "off"),
        "on": reasoned_run(reasoning_sim, folder, "on", "--reasoning", "on", "--max-tokens", "512"),
    }


def turns_of(rep: dict) -> list[dict]:
    [session] = rep["sessions"]
    assert len(session["turns"]) == len(TARGETS)
    return session["turns"]


def assert_on_target(rep: dict) -> None:
    """Each turn's prompt (the server's count) within 2% of the schedule: the history re-sent only the answers."""
    contexts = [t["context_tokens"] for t in turns_of(rep)]
    assert all(abs(c - target) <= 0.02 * target for c, target in zip(contexts, TARGETS)), contexts


def test_the_servers_default_thinks_through_128_tokens_and_never_answers(runs):
    _, rep = runs["auto"]
    for t in turns_of(rep):
        assert t["no_answer"] is True and t["needle"] is None  # not a wrong answer: no answer at all
        assert t["reasoning_tokens"] == 128 and t["answer_tokens"] == 0 and t["output_tokens"] == 128
        assert t["ttft_s"] is not None and t["ttfa_s"] is None
    assert_on_target(rep)
    summary = rep["sessions"][0]["summary"]
    assert summary["needle_found"] == 0 and summary["needle_no_answer"] == 3 and summary["reasoning_tokens"] == 384
    assert rep["run"]["reasoning"] == "auto" and rep["run"]["max_tokens"] is None
    assert rep["run"]["output_tokens"] == 128


def test_reasoning_off_answers_every_needle(runs):
    _, rep = runs["off"]
    for t in turns_of(rep):
        assert t["needle"] is True and t["no_answer"] is False
        assert t["reasoning_tokens"] == 0 and t["answer_tokens"] == t["output_tokens"] > 0
        assert t["ttfa_s"] == t["ttft_s"]  # nothing was reasoned first: the first token is the answer's
    assert_on_target(rep)
    assert rep["run"]["reasoning"] == "off"


def test_reasoning_on_with_room_answers_after_the_thinking(runs):
    record, rep = runs["on"]
    for t in turns_of(rep):
        assert t["reasoning_tokens"] == THINK and t["answer_tokens"] > 0
        assert t["output_tokens"] == THINK + t["answer_tokens"] <= 512
        assert t["needle"] is True and t["no_answer"] is False
        assert t["ttfa_s"] > t["ttft_s"] > 0
    assert_on_target(rep)
    assert rep["run"]["reasoning"] == "on" and rep["run"]["max_tokens"] == 512
    header = read_recording(record).header
    assert header.max_tokens == 512 and header.reasoning == "on" and header.output_tokens == 128


def test_every_report_format_shows_the_reasoning_figures(runs):
    record = str(runs["auto"][0])
    table = rw("report", record).stdout
    assert "TTFA s" in table and "│ no answer │" in table and "(3 no answer)" in table
    md = rw("report", record, "--format", "md").stdout
    assert "| TTFA s |" in md and "| reasoning |" in md and "no answer |" in md
    head, *rows = rw("report", record, "--format", "csv").stdout.splitlines()
    cols = head.split(",")
    for name in ("ttfa_s", "reasoning_tokens", "answer_tokens", "no_answer"):
        assert name in cols
    assert all(r.split(",")[cols.index("no_answer")] == "True" for r in rows)
    # A run that did not reason keeps the table it always had.
    plain = rw("report", str(runs["off"][0])).stdout
    assert "TTFA" not in plain and "no answer" not in plain


def test_the_exported_picture_marks_a_turn_with_no_answer(runs, tmp_path):
    svg = tmp_path / "auto.svg"
    assert rw("export", str(runs["auto"][0]), "--svg", str(svg)).returncode == 0
    marks = [m for m in svg.read_text().split('class="needle"')[1:]]
    assert len(marks) == 3 and all("∅" in m.split("</text>")[0] for m in marks)


def test_compare_sets_the_answer_times_side_by_side(runs):
    auto, on = str(runs["auto"][0]), str(runs["on"][0])
    out = rw("compare", auto, on, env={"COLUMNS": "250"}).stdout
    assert "TTFA" in out and "0/3 (3 no answer)" in out and "3/3" in out
    cmp = json.loads(rw("compare", auto, on, "--format", "json").stdout)
    first, second = cmp["runs"]
    assert first["needle_no_answer"] == 3 and first["ttfa_max_s"] is None and first["reasoning_tokens"] == 384
    assert second["needle_no_answer"] == 0 and second["ttfa_max_s"] > 0 and second["reasoning_tokens"] == 3 * THINK
    # Per turn too: each run's time to the first answer token beside its TTFT (none where it never answered).
    on_report = report_json(runs["on"][0])
    for turn in cmp["turns"]:
        mine = on_report["sessions"][0]["turns"][turn["turn"] - 1]
        assert turn["ttfa_s"] == [None, mine["ttfa_s"]] and turn["ttfa_s"][1] > turn["ttft_s"][1]
    md = rw("compare", auto, on, "--format", "md").stdout
    assert md.count(" TTFA s |") == 2, md  # the per-turn table: a TTFA column per run


def test_the_events_line_and_the_sessions_panel_show_reasoning(runs):
    rec = read_recording(runs["on"][0])
    state = RunState(rec.header)
    first = next(e for e in rec.events if isinstance(e, ev.FirstToken))
    for e in rec.events:
        state.apply(e)
        if e is first:
            s = state.sessions["s1"]
            assert s.state == "reasoning"  # between prefilling and answering
            assert "reasoning" in session_row(s, e.t, 120).plain
        if isinstance(e, ev.FirstAnswer):
            assert state.sessions["s1"].state == "decoding"
    line = turn_line(state.turns[0])
    assert f"reasoning {THINK} tok" in line and "answer " in line and "needle ✓" in line
    cut = RunState(read_recording(runs["auto"][0]).header)
    for e in read_recording(runs["auto"][0]).events:
        cut.apply(e)
    assert cut.sessions["s1"].needles == [NO_ANSWER] * 3
    assert "needle: no answer" in turn_line(cut.turns[0])
    assert needle_marks(cut.sessions["s1"].needles, 10).plain == "∅∅∅"


async def test_the_focus_screen_shows_both_first_token_times(runs):
    from rampwatch.tui.sources import ReplaySource

    heads, cells = await focus_table(ReplaySource(read_recording(runs["on"][0])), (160, 40))
    assert "TTFT s" in heads and "TTFA s" in heads and "reasoning" in heads and "answer" in heads
    assert len(cells) == 3
    out = heads.index("answer")
    assert all(int(row[out]) > 0 for row in cells)  # the answer's own tokens, beside the reasoning's


def no_tokenize(app):
    """The simulated server without /tokenize: budgeting then has only usage to go on."""

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/tokenize":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"Not Found"})
            return
        await app(scope, receive, send)

    return wrapped


@pytest.mark.parametrize("extra", [(), ("--max-tokens", "512")], ids=["cut", "answered"])
def test_without_tokenize_the_answer_tokens_stand_in_for_the_resent_reply(tmp_path, extra):
    """No /tokenize: the reply's tokens as the next turn re-sends them come from usage, and only the answer's
    count (completion - reasoning), since the reasoning is never re-sent."""
    sim = SimServer(make_profile("tiny"), reasoning_tokens=THINK)
    with ThreadedServer(no_tokenize(sim.app)) as server:
        assert httpx.post(server.url + "/tokenize", json={"prompt": "x"}).status_code == 404
        _, rep = reasoned_run(server.url, tmp_path, "no-tokenize", *extra)
    assert all(t["reasoning_tokens"] == (THINK if extra else 128) for t in turns_of(rep))
    contexts = [t["context_tokens"] for t in turns_of(rep)]
    # Turn 1 has no usage to correct it; from turn 2 the budget follows usage.
    assert all(abs(c - target) <= 0.02 * target for c, target in zip(contexts[1:], TARGETS[1:])), contexts


def test_demo_reasoning_tokens_reach_its_simulated_engine(tmp_path):
    record = tmp_path / "demo.jsonl"
    p = rw(
        "demo",
        "--headless",
        "--profile",
        "tiny",
        "--time-scale",
        "1",
        "--gpus",
        "0",
        "--sessions",
        "1",
        "--schedule",
        "1k,2k",
        "--output-tokens",
        "16",
        "--reasoning-tokens",
        "40",
        "--record",
        str(record),
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    turns = report_json(record)["sessions"][0]["turns"]
    assert [(t["reasoning_tokens"], t["no_answer"]) for t in turns] == [(16, True), (16, True)]


def test_a_users_own_extra_body_switches_win_over_reasoning(reasoning_sim, tmp_path):
    mine = '{"chat_template_kwargs": {"enable_thinking": true, "thinking": true}, "top_k": 20}'
    _, rep = reasoned_run(reasoning_sim, tmp_path, "mine", "--reasoning", "off", "--extra-body", mine)
    assert all(t["reasoning_tokens"] == 128 and t["no_answer"] for t in turns_of(rep))  # it thought: mine won
    assert rep["run"]["extra_body"] == {
        "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
        "top_k": 20,
    }


def test_switches_and_a_users_own_template_kwargs():
    assert reasoning_switches("auto") == {}
    assert reasoning_switches("off") == {"chat_template_kwargs": {"enable_thinking": False, "thinking": False}}
    assert reasoning_switches("on") == {"chat_template_kwargs": {"enable_thinking": True, "thinking": True}}
    user = {"top_k": 20, "chat_template_kwargs": {"thinking": True, "reasoning_effort": "low"}}
    assert with_reasoning(user, "off") == {
        "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False, "thinking": True, "reasoning_effort": "low"},
    }
    assert with_reasoning(user, "auto") is user and user["chat_template_kwargs"] == {  # never mutated
        "thinking": True,
        "reasoning_effort": "low",
    }


def sse(*chunks: dict, done: bool = False) -> bytes:
    """Server-sent events of these chunks (and the stream's end)."""
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n" if done else b""
    )


def test_the_parser_tells_reasoning_from_the_answer():
    calls: list[tuple[str, float]] = []
    p = ChatStreamParser(
        lambda t: calls.append(("first", t)),
        lambda ts, counts, piled: None,
        on_reasoning=lambda t: calls.append(("reasoning", t)),
        on_answer=lambda t: calls.append(("answer", t)),
    )
    p.feed(sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), 1.0)  # the role prelude
    p.feed(sse({"choices": [{"delta": {"reasoning": "hm"}}]}), 2.0)  # vLLM 0.32's field
    p.feed(sse({"choices": [{"delta": {"reasoning_content": " so"}}]}), 3.0)  # SGLang's, llama.cpp's
    usage = {"completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 2}}
    p.feed(
        sse(
            {"choices": [{"delta": {"content": "42"}}]},
            {"choices": [{"delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage},
            done=True,
        ),
        4.0,
    )
    res = p.finish()
    assert calls == [("reasoning", 2.0), ("answer", 4.0)]  # the first token was reasoning: no plain on_first
    assert (res.first_t, res.answer_t, res.reasoning_chunks, res.chunks) == (2.0, 4.0, 2, 3)
    assert (res.text, res.reasoning, res.reasoning_tokens, res.finish_reason) == ("42", "hm so", 2, "stop")

    plain: list[str] = []
    q = ChatStreamParser(
        lambda t: plain.append("first"), lambda ts, counts, piled: None, on_answer=lambda t: plain.append("answer")
    )
    q.feed(sse({"choices": [{"delta": {"content": "hi"}, "finish_reason": "length"}]}, done=True), 1.0)
    res = q.finish()
    assert plain == ["first"] and res.answer_t == 1.0 and res.reasoning_chunks == 0 and res.finish_reason == "length"


def test_a_recording_from_before_reasoning_still_loads_as_answers():
    old = b'{"type":"TurnDone","t":2.0,"session":"s1","turn":1,"status":"ok","completion_tokens":8,"needle":true}'
    done = decode_event(old)
    assert isinstance(done, ev.TurnDone) and done.reasoning_tokens is None and done.finish_reason is None
    first = decode_event(b'{"type":"FirstToken","t":1.0,"session":"s1","turn":1}')
    assert isinstance(first, ev.FirstToken) and first.reasoning is False
    state = RunState()
    state.apply(ev.SessionPlanned(t=0.0, session="s1", schedule=[1000], salt="x"))
    state.apply(ev.RequestSent(t=0.5, session="s1", turn=1, target_tokens=1000, new_tokens_est=1000, body_bytes=1))
    state.apply(first)
    state.apply(done)
    [rec] = state.turns
    assert rec.ttfa == rec.ttft == 0.5 and rec.reasoning_tokens == 0 and rec.answer_tokens == 8
    assert not rec.no_answer and state.sessions["s1"].needles == [True]


def test_bad_reasoning_values_get_one_line_and_exit_2():
    p = rw("run", "http://127.0.0.1:9", "--reasoning", "maybe")
    assert p.returncode == 2 and "--reasoning" in p.stderr and "Traceback" not in p.stderr
    p = rw("sim", "--reasoning-tokens", "-1")
    assert p.returncode == 2 and "--reasoning-tokens" in p.stderr and "Traceback" not in p.stderr
    p = rw("run", "http://127.0.0.1:9", "--max-tokens", "0")
    assert p.returncode == 2 and "--max-tokens" in p.stderr and "Traceback" not in p.stderr


def test_the_sim_switches_thinking_off_for_either_template_switch(reasoning_sim):
    def ask(kwargs: dict | None) -> dict:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300}
        if kwargs is not None:
            body["chat_template_kwargs"] = kwargs
        return httpx.post(reasoning_sim + "/v1/chat/completions", json=body, timeout=30).json()

    thinking = ask(None)
    assert thinking["usage"]["completion_tokens_details"]["reasoning_tokens"] == THINK
    assert thinking["choices"][0]["message"]["reasoning_content"]
    for switch in ({"enable_thinking": False}, {"thinking": False}):
        assert ask(switch)["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert ask({"enable_thinking": True})["usage"]["completion_tokens_details"]["reasoning_tokens"] == THINK


def test_a_cut_during_reasoning_is_length_with_no_content(reasoning_sim):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True}
    body["stream_options"] = {"include_usage": True}
    stream = httpx.post(reasoning_sim + "/v1/chat/completions", json=body, timeout=30).text
    lines = [json.loads(x[6:]) for x in stream.split("\n\n") if x.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in lines if c["choices"]]
    assert not any(d.get("content") for d in deltas)
    assert sum(1 for d in deltas if d.get("reasoning_content")) == 50
    assert [c["choices"][0]["finish_reason"] for c in lines if c["choices"]][-1] == "length"
    assert lines[-1]["usage"]["completion_tokens"] == 50
    assert lines[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 50


def test_with_max_tokens_the_history_keeps_output_tokens_of_the_answer(tmp_path):
    """--max-tokens 512 --output-tokens 16 --ignore-eos: the server thinks 200 tokens and answers 312 (all of it
    measured), and the next turn re-sends the first 16 of those answer tokens, so the context still lands on
    the schedule."""
    sim = SimServer(make_profile("tiny"), reasoning_tokens=THINK)
    with ThreadedServer(sim.app) as server, CaptureRelay(server.url) as relay:
        record = tmp_path / "cut.jsonl"
        p = rw(
            *small_run(relay.url, "--record", str(record), schedule=SCHEDULE, output_tokens=16),
            *("--reasoning", "on", "--max-tokens", "512", "--ignore-eos"),
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        bodies = [b for _, b in chat_requests(relay)]
    rep = report_json(record)
    assert all(t["reasoning_tokens"] == THINK and t["answer_tokens"] == 512 - THINK for t in turns_of(rep))
    assert all(t["needle"] is True for t in turns_of(rep))  # judged on the whole answer
    assert [b["max_tokens"] for b in bodies] == [512] * 3
    resent = [m["content"] for m in bodies[-1]["messages"] if m["role"] == "assistant"]
    # The simulated engine's answer: its sentence's words (one token each), over and over once eos is ignored.
    words = resent[0][: resent[0].index(".") + 1].split()
    tokens = [(" " if k else "") + w for k, w in enumerate(words)]
    assert words[:4] == ["The", "access", "code", "of"]
    assert resent == ["".join(tokens[k % len(tokens)] for k in range(16))] * 2
    assert_on_target(rep)
    assert rep["run"]["output_tokens"] == 16 and rep["run"]["max_tokens"] == 512


def test_the_resent_answer_is_cut_at_its_budget_token():
    pieces = [f" w{k}" for k in range(40)]
    assert resent_answer(pieces, 40, 128) == ("".join(pieces), 40)  # within the budget: whole
    assert resent_answer(pieces, 40, 16) == ("".join(pieces[:16]), 16)  # a token a chunk: 16 chunks
    assert resent_answer(pieces, 80, 16) == ("".join(pieces[:8]), 16)  # two tokens a chunk (speculative decoding)
    assert resent_answer([], 0, 16) == ("", 0)  # cut while reasoning: no answer to re-send


@pytest.mark.parametrize(
    ("reasoning", "max_tokens", "said"),
    [("off", None, "; reasoning off"), ("on", 4096, "; reasoning on, max 4096 tok"), ("auto", 512, "; max 512 tok")],
)
def test_the_headless_first_line_says_the_reasoning_mode_and_the_cap(reasoning, max_tokens, said):
    cfg = RunConfig(url="http://127.0.0.1:9", reasoning=reasoning, max_tokens=max_tokens)
    line = announcement(cfg, Run(cfg, record=False))
    assert line.endswith(said), line
    quiet = RunConfig(url="http://127.0.0.1:9")
    assert "reasoning" not in announcement(quiet, Run(quiet, record=False))  # auto: the server's default, unsaid
