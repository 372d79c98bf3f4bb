"""`rampwatch trace info` as a user runs it: its figures as text and JSON, the slice's flags, bad input as one
line and exit 2, `rampwatch trace` without a subcommand, and a command that loads no UI or simulator."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rampwatch.tui.cli import main
from tests import procs
from tests.conftest import rampwatch_cmd

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"


def info(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["trace", "info", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_trace_info_prints_each_figure(capsys):
    code, out, _ = info(capsys, str(TRACES / "agentic.jsonl.gz"), "--kv-tokens", "256k")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip() and not line.startswith(" ")}
    assert lines["trace"].endswith("agentic.jsonl.gz: agentic, 64-token blocks")
    assert "sessions    8 (5 forked), 24 requests; turns per session p50 2  max 6" in out
    assert "max 199,346 tokens" in lines["context"]
    assert (
        "71% unbounded (1,591,296 of 2,228,367 prompt tokens); " in lines["ideal"]
        and "in an LRU pool of 262,144 KV tokens" in lines["ideal"]
    )
    assert lines["peak"].startswith("peak live   ") and " tokens in " in lines["peak"]
    assert "skipped" not in lines


def test_trace_info_json_is_the_figures(capsys):
    code, out, _ = info(capsys, str(TRACES / "mooncake.jsonl"), "--json", "--kv-tokens", "2048")
    assert code == 0
    figures = json.loads(out)
    assert (figures["format"], figures["block_size"], figures["sessions"], figures["requests"]) == (
        "mooncake",
        512,
        5,
        10,
    )
    assert figures["ideal_cached"] == 13_312 and figures["prompt_tokens"] == 22_700
    assert figures["ideal_hit_rate"] == pytest.approx(13_312 / 22_700)
    assert figures["ideal_cached_pool"] < figures["ideal_cached"] and figures["kv_tokens"] == 2048
    assert figures["context_tokens"] == {"p50": 2050.0, "p99": pytest.approx(3846.0), "max": 3900}


def test_the_slice_flags_are_counted_in_the_output(capsys):
    code, out, _ = info(
        capsys,
        str(TRACES / "mooncake.jsonl"),
        "--start",
        "1s",
        "--duration",
        "10s",
        "--max-context",
        "2k",
        "--sessions",
        "2",
    )
    assert code == 0
    skipped = next(line for line in out.splitlines() if line.startswith("skipped"))
    for said in (
        "1 request due before --start",
        "3 requests longer than --max-context",
        "2 requests of sessions past --sessions",
        "nothing read after --duration",
    ):
        assert said in skipped, skipped
    code, out, _ = info(capsys, str(TRACES / "mooncake.jsonl"), "--sessions", "2", "--json")
    assert json.loads(out)["sessions"] == 2


def test_skip_bad_reads_past_bad_rows_and_says_how_many(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    good = '{"timestamp": %d, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}'
    path.write_text("\n".join([good % 0, good % 5, good % 3, "{torn", good % 9]) + "\n")
    code, _, err = info(capsys, str(path))
    assert (
        code == 2
        and err
        == f"rampwatch: {path}: line 3: due at 0.003 s, before an earlier row's 0.005 s; sort the rows by time\n"
    )
    code, out, _ = info(capsys, str(path), "--skip-bad")
    assert code == 0 and "3 requests" in out
    assert "skipped     1 row with timestamps out of order; 1 row with a missing or malformed field" in out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["trace"], "rampwatch trace: the following arguments are required: SUBCOMMAND"),
        (["trace", "summary"], "rampwatch trace: argument SUBCOMMAND: invalid choice: 'summary'"),
        (["trace", "info"], "rampwatch trace info: the following arguments are required: FILE"),
        (["trace", "info", "/no/such/trace.jsonl"], "rampwatch: no such trace: /no/such/trace.jsonl"),
        (
            ["trace", "info", str(TRACES / "aiperf.jsonl"), "--format", "bailian"],
            "line 1: an AIPerf multi_turn session (it has turns) in a Qwen-Bailian trace",
        ),
        (["trace", "info", str(TRACES / "aiperf.jsonl"), "--kv-tokens", "lots"], "not a token count: 'lots'"),
        (["trace", "info", str(TRACES / "aiperf.jsonl"), "--block-size", "0"], "must be at least 1"),
    ],
    ids=["no-subcommand", "bad-subcommand", "no-file", "missing", "wrong-format", "bad-tokens", "bad-block"],
)
def test_bad_input_is_one_line_and_exit_2(args, said):
    p = procs.run([*rampwatch_cmd(), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert said in p.stderr and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr and p.stdout == ""


def test_trace_info_loads_no_ui_web_server_or_simulator():
    code = (
        "import json, sys\nfrom rampwatch.tui.cli import main\n"
        f"code = main(['trace', 'info', {str(TRACES / 'bailian.csv')!r}])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('uvicorn', 'starlette', 'textual',"
        " 'textual_serve') or m.startswith('rampwatch.drivers.sim'))\n"
        "print(json.dumps([code, heavy]), file=sys.stderr)\n"
    )
    p = procs.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert json.loads(p.stderr.strip().splitlines()[-1]) == [0, []]
