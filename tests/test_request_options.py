"""--extra-body and --header (issue 20): what every chat request carries besides the conversation, checked
on the server's side of a loopback relay; credential headers reach the server and nowhere else."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rampwatch.drivers.client.request_options import (
    RESERVED_BODY_KEYS,
    merge_headers,
    parse_extra_body,
    parse_header,
    request_headers,
)
from rampwatch.drivers.run.scrub import scrub_argv
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.tui.cli.reference import subcommands
from rampwatch.tui.cli.spec import build_parser
from tests.conftest import report_json, rw, small_run
from tests.simhost import CaptureRelay, ThreadedSim

SECRET = "router-secret-value-4242"
EXTRA = '{"top_k": 20, "chat_template_kwargs": {"enable_thinking": false}}'


def chat_requests(relay: CaptureRelay) -> list[tuple[dict[str, str], dict]]:
    """(headers, body) of every chat request that went through the relay."""
    out = []
    for raw in relay.requests_to("/v1/chat/completions"):
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")[1:]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        out.append((headers, json.loads(body)))
    return out


def test_a_header_names_its_session_turn_and_run_per_request():
    h = parse_header("x-affinity: {run}/{session}/t{turn}")
    assert h.per_request and not h.secret
    assert request_headers([h], "s2", 7, "abc") == {"x-affinity": "abc/s2/t7"}
    assert parse_header("Authorization: Bearer x").secret
    assert not parse_header("x-team: serving").per_request


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("nocolon", "use 'NAME: VALUE'"),
        (": value", "use 'NAME: VALUE'"),
        ("bad name: v", "not a header name"),
        ("x: {user}", "{user} is not a placeholder"),
        ("x: {session", "unbalanced"),
        ("Host: x", "set by rampwatch"),
        ("content-type: text/plain", "set by rampwatch"),
        ("x: café", "ASCII"),
    ],
)
def test_a_bad_header_says_why(spec, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_header(spec)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"stream": false}', '"stream" is set by rampwatch'),
        ('{"max_tokens": 9}', '"max_tokens" is set by rampwatch (use --max-tokens)'),
        ('{"messages": []}', '"messages" is set by rampwatch'),
    ],
)
def test_a_bad_extra_body_says_why(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_extra_body(text)


# Each key rampwatch sets itself from a flag, and that flag: what the refusal of the key must name.
SET_BY_FLAG = {
    "model": "--model",
    "max_tokens": "--max-tokens",
    "max_completion_tokens": "--max-tokens",
    "ignore_eos": "--ignore-eos",
    "min_tokens": "--ignore-eos",
}


@pytest.mark.parametrize("key", sorted(RESERVED_BODY_KEYS))
def test_a_refused_body_key_names_the_flag_that_sets_it(key):
    with pytest.raises(ValueError) as refused:
        parse_extra_body(json.dumps({key: 1}))
    flag = SET_BY_FLAG.get(key)
    assert str(refused.value) == f'"{key}" is set by rampwatch' + (f" (use {flag})" if flag else "")
    if flag is not None:  # a flag of every command that sends chat requests
        flags = {
            name: {f for a in sub._actions for f in a.option_strings} for name, _, sub in subcommands(build_parser())
        }
        assert all(flag in flags[name] for name in ("run", "demo", "sweep")), flag


def test_an_extra_body_file_is_read(tmp_path):
    f = tmp_path / "body.json"
    f.write_text(EXTRA)
    assert parse_extra_body(f"@{f}") == json.loads(EXTRA)


def test_a_header_replaces_the_keys_authorization_whatever_its_case():
    merged = merge_headers({"Authorization": "Bearer key", "X-A": "1"}, {"authorization": "Bearer mine"})
    assert merged == {"X-A": "1", "authorization": "Bearer mine"}


def test_secrets_in_a_body_a_prompt_or_a_mistyped_flag_stay_out_of_the_recorded_command():
    argv = ["run", "u", "--extra-body", '{"api_key": "short", "top_k": 20}', "--system-prompt", "use sk-abcdefgh1234"]
    argv += ["--heade", "Authorization: Bearer abc123"]
    assert scrub_argv(argv)[3:] == ['{"api_key":"***","top_k":20}', "--system-prompt", "use ***", "--heade"] + [
        "Authorization: ***"
    ]
    p = rw("run", "http://127.0.0.1:9", "--heade", f"Authorization: Bearer {SECRET}", "--no-record")
    assert p.returncode == 2 and SECRET not in p.stdout + p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_credential_header_is_hidden_in_the_recorded_command():
    argv = ["run", "u", "--header", f"Authorization: Bearer {SECRET}", "--header=X-Api-Key: k", "--header", "x: {run}"]
    assert scrub_argv(argv) == [
        "run",
        "u",
        "--header",
        "Authorization: ***",
        "--header=X-Api-Key: ***",
        "--header",
        "x: {run}",
    ]


@pytest.mark.parametrize(
    "flags",
    [
        ["--extra-body", "{"],
        ["--extra-body", '{"stream": false}'],
        ["--extra-body", "@/no/such/body.json"],
        ["--header", "nocolon"],
        ["--header", "x-session: {sesion}"],
    ],
)
def test_bad_request_options_are_one_line_and_exit_2(flags):
    p = rw("run", "http://127.0.0.1:9", *flags, "--headless", "--no-record")
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert flags[0] in p.stderr


def test_headers_and_body_reach_the_server_and_the_credential_nothing_else(tmp_path):
    """The simulated engine guards /v1 with a key that only the --header Authorization carries, so every turn
    that answers proves it arrived; the relay shows what arrived and where."""
    record = tmp_path / "run.jsonl"
    with ThreadedSim(make_profile("tiny"), api_key=SECRET) as sim, CaptureRelay(sim.url) as relay:
        p = rw(
            *small_run(relay.url, "--record", str(record)),
            "--sessions",
            "2",
            "--header",
            "x-session-id: {session}",
            "--header",
            "x-turn: {run}-t{turn}",
            "--header",
            f"Authorization: Bearer {SECRET}",
            "--extra-body",
            EXTRA,
            env={"OPENAI_API_KEY": ""},
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        chats = chat_requests(relay)
        metrics = relay.requests_to("/metrics")
    salt = json.loads(record.read_text().splitlines()[0])["salt"]
    seen = sorted((h["x-session-id"], h["x-turn"]) for h, _ in chats)
    assert seen == [(s, f"{salt}-t{t}") for s in ("s1", "s2") for t in (1, 2)]
    assert all(h["authorization"] == f"Bearer {SECRET}" for h, _ in chats)
    assert all(b["top_k"] == 20 and b["chat_template_kwargs"] == {"enable_thinking": False} for _, b in chats)
    assert all(b["stream"] is True and b["max_tokens"] == 8 for _, b in chats)  # rampwatch's own keys unchanged
    assert metrics and not any(b"authorization" in m.lower() for m in metrics)  # the credential went to /v1 only
    assert SECRET not in record.read_text() and SECRET not in p.stdout + p.stderr
    run = report_json(record)["run"]
    assert run["request_headers"] == {"x-session-id": "{session}", "x-turn": "{run}-t{turn}", "Authorization": "***"}
    assert run["extra_body"] == json.loads(EXTRA)
    text = rw("report", str(record)).stdout
    assert "header x-session-id: {session}" in text and "header Authorization: ***" in text and '"top_k":20' in text


def test_headers_and_body_reach_a_real_vllm_server(vllm_server, tmp_path: Path):
    """vLLM takes X-Request-Id as its request id and validates the sampling options: a top_k it accepts
    answers, one it refuses fails every turn with vLLM's own words about top_k."""
    record = tmp_path / "ok.jsonl"
    with CaptureRelay(vllm_server) as relay:
        p = rw(
            *small_run(relay.url, "--record", str(record)),
            "--header",
            "X-Request-Id: rw-{session}-t{turn}",
            "--extra-body",
            '{"top_k": 20}',
            timeout=600,
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        chats = chat_requests(relay)
    assert sorted(h["x-request-id"] for h, _ in chats) == ["rw-s1-t1", "rw-s1-t2"]
    assert all(b["top_k"] == 20 for _, b in chats)
    refused = tmp_path / "refused.jsonl"
    p = rw(*small_run(vllm_server, "--record", str(refused)), "--extra-body", '{"top_k": -7}', timeout=600)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    turns = report_json(refused)["sessions"][0]["turns"]
    assert turns and all("top_k" in (t["error"] or "") for t in turns)
