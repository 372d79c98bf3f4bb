"""--extra-body, --header, --reasoning and --max-tokens through `demo --headless` and `sweep`, as a user runs
them: the recording's header says what was sent (credentials hidden), the request carried it where the simulated
engine lets a test see it, and bad values to sweep or demo are one line and exit 2."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.run.scrub import scrub_header_arg
from rampwatch.drivers.sim.profiles import make_profile
from tests.conftest import report_json
from tests.conftest import rw as rw_in_root
from tests.simhost import CaptureRelay, ThreadedSim
from tests.test_request_options import chat_requests

SECRET = "router-secret-value-5151"
rw = functools.partial(rw_in_root, timeout=300)  # a demo or a sweep runs longer than most commands
NO_KEY = {"OPENAI_API_KEY": ""}  # the --header Authorization is the only credential


def files_text(folder: Path) -> str:
    """Every file a run wrote under `folder`, as one text (to look for a secret in)."""
    return "".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())


def test_demo_sends_and_records_the_request_flags(tmp_path):
    """--reasoning off reaches the simulated reasoning engine (it does not think), --max-tokens 24 is what it
    generates (--ignore-eos, the demo's default: exactly max_tokens), and the X-Request-Id --header is what the
    engine's own trace spans name each request by; the header keeps all four, the Authorization hidden."""
    record = tmp_path / "demo.jsonl"
    p = rw(
        "demo", "--headless", "--profile", "tiny", "--gpus", "0", "--sessions", "1", "--schedule", "1k,2k",
        "--output-tokens", "8", "--reasoning-tokens", "40", "--reasoning", "off", "--max-tokens", "24",
        "--extra-body", '{"top_k": 20}', "--header", "X-Request-Id: mine-{session}-t{turn}",
        "--header", f"Authorization: Bearer {SECRET}", "--record", str(record),
        env=NO_KEY,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "reasoning off, max 24 tok" in p.stdout.splitlines()[0]
    rec = read_recording(record)
    h = rec.header
    assert h.extra_body == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False, "thinking": False}}
    assert h.request_headers == {"X-Request-Id": "mine-{session}-t{turn}", "Authorization": "***"}
    assert (h.reasoning, h.max_tokens, h.output_tokens) == ("off", 24, 8)
    turns = report_json(record)["sessions"][0]["turns"]
    assert [(t["reasoning_tokens"], t["output_tokens"]) for t in turns] == [(0, 24), (0, 24)]
    sent = sorted(e.request_id for e in rec.events if isinstance(e, ev.RequestSent))
    spans = sorted(e.request_id for e in rec.events if isinstance(e, ev.EngineSpan))
    assert sent == spans == ["mine-s1-t1", "mine-s1-t2"]
    assert SECRET not in files_text(tmp_path) + p.stdout + p.stderr


def test_sweep_sends_and_records_the_request_flags(tmp_path):
    """Every chat request of every point carries the body options, the thinking switch, max_tokens and the headers
    (the simulated engine answers only the --header Authorization); each point's header records them, hidden."""
    sweep = tmp_path / "flags.sweep.json"
    with ThreadedSim(make_profile("tiny"), api_key=SECRET) as sim, CaptureRelay(sim.url) as relay:
        p = rw(
            "sweep", relay.url, "--sessions", "1,2", "--schedule", "1k,2k", "--output-tokens", "8", "--gpu", "none",
            "--reasoning", "on", "--max-tokens", "16", "--extra-body", '{"top_k": 20}',
            "--header", "x-session-id: {session}", "--header", f"Authorization: Bearer {SECRET}",
            "--record", str(sweep),
            env=NO_KEY,
        )  # fmt: skip
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        chats = chat_requests(relay)
    assert len(chats) == 2 + 4  # 1 session then 2, two turns each
    for headers, body in chats:
        assert headers["authorization"] == f"Bearer {SECRET}" and headers["x-session-id"] in ("s1", "s2")
        assert body["top_k"] == 20 and body["max_tokens"] == 16
        assert body["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True}
    points = sorted(tmp_path.glob("*.jsonl"))
    assert len(points) == 2
    for point in points:
        h = read_recording(point).header
        assert h.extra_body == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": True, "thinking": True}}
        assert h.request_headers == {"x-session-id": "{session}", "Authorization": "***"}
        assert (h.reasoning, h.max_tokens, h.output_tokens) == ("on", 16, 8)
    assert json.loads(sweep.read_text())["runs"]
    assert sum("reasoning on, max 16 tok" in line for line in p.stdout.splitlines()) == 2  # each point's first line
    assert SECRET not in files_text(tmp_path) + p.stdout + p.stderr


BAD_REQUEST_FLAGS = [
    (["--extra-body", "{"], "--extra-body: not JSON"),
    (["--extra-body", '{"max_tokens": 9}'], '--extra-body: "max_tokens" is set by rampwatch (use --max-tokens)'),
    (["--extra-body", '{"stream": false}'], '"stream" is set by rampwatch'),
    (["--header", "nocolon"], "--header 'nocolon': use 'NAME: VALUE'"),
    (["--header", f"Authorization Bearer {SECRET}"], "--header 'Authorization ***': use 'NAME: VALUE'"),
    (["--reasoning", "maybe"], "--reasoning: invalid choice: 'maybe'"),
    (["--max-tokens", "0"], "--max-tokens: must be at least 1: '0'"),
    (["--think-time", "5s..2s"], "the range must go from the shorter pause to the longer"),
    (["--think-time", "soon"], "--think-time: not a duration: 'soon'"),
]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        *BAD_REQUEST_FLAGS,
        (["--sessions", "1,x"], "--sessions: not a list of session counts: '1,x'"),
        (["--sessions", "4,2"], "--sessions: session counts must be growing whole numbers >= 1: '4,2'"),
        (["--sessions", "0"], "session counts must be growing whole numbers >= 1: '0'"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_bad_values_to_sweep_are_one_line_and_exit_2(flags, message):
    args = ["sweep", "http://127.0.0.1:9", "--schedule", "1k", "--gpu", "none", "--no-record"]
    p = rw(*args, *([] if flags[0] == "--sessions" else ["--sessions", "1"]), *flags)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == "" and SECRET not in p.stderr


@pytest.mark.parametrize(
    ("flags", "message"), BAD_REQUEST_FLAGS, ids=lambda v: v if isinstance(v, str) else " ".join(v)
)
def test_bad_request_flags_to_demo_are_one_line_and_exit_2(flags, message):
    p = rw("demo", "--headless", "--no-record", "--profile", "tiny", *flags)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == "" and SECRET not in p.stderr


def test_a_credential_header_without_its_colon_is_still_hidden():
    assert scrub_header_arg(f"Authorization Bearer {SECRET}") == "Authorization ***"
    assert scrub_header_arg(f"X-Api-Key={SECRET}") == "X-Api-Key ***"
    assert scrub_header_arg("x-team serving") == "x-team serving"  # not a credential's name: shown as typed
