"""The command line's shape: the generated reference is current, every flag explains itself, the light
commands stay light, and a mistyped flag never echoes a key."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from rampwatch.drivers.run.scrub import scrub_argv, scrub_message
from rampwatch.tui.cli.options import config_from, demo_config
from rampwatch.tui.cli.reference import REGENERATE, reference, subcommands
from rampwatch.tui.cli.spec import build_parser
from tests import procs
from tests.conftest import rampwatch_cmd

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "recordings" / "vllm-cpu-2x32k.sample.jsonl"
KEY = "sk-proj-Zq8vR2mXw9LpT4nB7cYs3Kd6"


def test_docs_cli_md_is_generated_from_the_parser():
    on_disk = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert on_disk == reference(), f"docs/cli.md is stale: regenerate it with `{REGENERATE}`"


def test_every_command_and_flag_has_help():
    for name, help_text, parser in subcommands(build_parser()):
        assert help_text, name
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help and len(action.help) > 8, f"rampwatch {name} {action.option_strings or action.dest}"


@pytest.mark.parametrize(
    "command", [["report", str(SAMPLE)], ["compare", str(SAMPLE), str(SAMPLE)], ["export", str(SAMPLE), "--svg", "OUT"]]
)
def test_reading_commands_load_no_ui_web_server_or_simulator(command, tmp_path):
    command = [str(tmp_path / "out.svg") if a == "OUT" else a for a in command]
    code = (
        "import json, sys\nfrom rampwatch.tui.cli import main\n"
        f"code = main({command!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('uvicorn', 'starlette', 'textual',"
        " 'textual_serve') or m.startswith('rampwatch.drivers.sim'))\n"
        "print(json.dumps([code, heavy]), file=sys.stderr)\n"
    )
    p = procs.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    exit_code, heavy = json.loads(p.stderr.strip().splitlines()[-1])
    assert exit_code == 0, p.stderr
    assert heavy == []


def test_the_ui_never_imports_the_command_line():
    """The app and its panels sit below the command line: their defaults (the refresh) come from below too."""
    widgets = sorted(f"rampwatch.tui.widgets.{p.stem}" for p in (ROOT / "tui" / "widgets").glob("*.py"))
    code = (
        "import importlib, json, sys\n"
        f"for m in {['rampwatch.tui.app', *widgets]!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rampwatch.tui.cli'))))\n"
    )
    p = procs.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize(
    "args", [["--api-key-fiel", KEY], [f"--api-key-fiel={KEY}"], ["--sessions", KEY], ["--tokn", KEY, "--api-key-file"]]
)
def test_a_mistyped_flag_never_prints_the_key(args):
    p = procs.run(
        [*rampwatch_cmd(), "run", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert p.returncode == 2
    said = p.stdout + p.stderr
    assert said.count("\n") == 1 and "Traceback" not in said
    leaked = [KEY[k : k + 6] for k in range(len(KEY) - 5) if KEY[k : k + 6] in said]
    assert leaked == [], said


def test_the_recorded_command_keeps_names_and_hides_keys():
    flags = (
        "--api-key-file /etc/key --api-key-env MY_KEY --model Meta-Llama-3-70B-Instruct-AWQ-INT4 --output-tokens 128"
    )
    argv = ["run", "http://user:pw@10.0.0.1:8000", *flags.split(), "--token", "abc", KEY]
    assert scrub_argv(argv) == ["run", "http://10.0.0.1:8000", *flags.split(), "--token", "***", "***"]
    assert KEY[3:9] not in scrub_message(f"invalid value: '{KEY}'", ["--sessions", KEY])


def test_config_leaves_the_parsed_arguments_as_they_were():
    for argv in (
        ["sweep", "http://127.0.0.1:9", "--sessions", "1,2", "--scale-to", "8k"],
        ["run", "http://127.0.0.1:9", "--scale-to", "8k"],
    ):
        args = build_parser().parse_args(argv)
        before = dict(vars(args))
        cfg = config_from(args, "run", argv)
        assert vars(args) == before and cfg.sessions == 1 and cfg.schedule[-1] == 8192
    argv = ["demo", "--scale-to", "8k", "--serve-metrics", "127.0.0.1:9999"]
    args = build_parser().parse_args(argv)
    before = dict(vars(args))
    cfg = demo_config(args, argv)
    assert vars(args) == before
    assert cfg.mode == "demo" and cfg.sessions == 2 and cfg.lockstep and cfg.ignore_eos
    assert cfg.serve_metrics == "127.0.0.1:9999" and cfg.command[:2] == ["rampwatch", "demo"]


def test_bad_serve_metrics_for_demo_is_one_line():
    p = procs.run(
        [*rampwatch_cmd(), "demo", "--headless", "--serve-metrics", "nohost:notaport"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.startswith("rampwatch: --serve-metrics") and p.stderr.count("\n") == 1
