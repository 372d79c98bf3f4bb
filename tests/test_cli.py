"""The command line as a user runs it: subprocesses, exit codes, files."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from tests import procs
from tests.conftest import rampwatch_cmd, rw

ROOT = Path(__file__).resolve().parents[1]


def test_drivers_never_import_textual():
    for path in (ROOT / "drivers").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            assert not any(
                n == "textual" or n.startswith("textual.") or n.startswith("tui") or n.startswith("rampwatch.tui")
                for n in names
            ), path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One headless two-session run against the simulated engine, recorded."""
    from rampwatch.drivers.sim.profiles import make_profile
    from tests.simhost import ThreadedSim

    out = tmp_path_factory.mktemp("rec") / "two.jsonl"
    with ThreadedSim(make_profile("tiny")) as s:
        p = rw(
            "run",
            s.url,
            "--sessions",
            "2",
            "--scale-to",
            "16k",
            "--output-tokens",
            "16",
            "--ignore-eos",
            "--headless",
            "--gpu",
            "none",
            "--record",
            str(out),
        )
    return p, out


def test_headless_run_prints_turn_lines_and_a_report(recorded):
    p, out = recorded
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(" turn ") >= 20 and "needle ✓" in p.stdout
    assert "session s1" in p.stdout and "session s2" in p.stdout
    assert out.exists() and f"recording: {out}" in p.stderr


def test_report_reproduces_the_live_numbers(recorded):
    p, out = recorded
    table = rw("report", str(out))
    assert table.returncode == 0
    live_table = p.stdout[p.stdout.index("rampwatch report:") :]
    assert table.stdout.strip() == live_table.strip()


OPEN_LOOP_KEYS = {
    "arrivals_per_min",
    "seed",
    "max_live",
    "arrived",
    "late_turns",
    "send_lag_max_s",
    "ttft_from_due_p50_s",
    "ttft_from_send_p50_s",
    "warmup",
    "trace_speed",
}
GOODPUT_KEYS = {
    "slo",
    "turns_met",
    "turns",
    "conversations_met",
    "conversations",
    "minutes",
    "turns_met_per_min",
    "conversations_met_per_min",
    "warmup",
    "warmup_turns",
}


def documented_keys(block: str) -> set[str]:
    """The keys docs/measurement.md's JSON schema lists for `"block": null | {...}` (or `null | [{...}]`)."""
    doc = (Path(__file__).parent.parent / "docs" / "measurement.md").read_text()
    start = doc.index(f'"{block}": null | ')
    inner = doc[doc.index("{", start) + 1 : doc.index("}", start)]
    return {k.strip().strip('"') for k in inner.split(",") if k.strip()}


def test_report_json_open_loop_and_goodput_keys(tmp_path):
    """An open-loop run with --slo and --warmup (recorded by hand: tests/test_arrivals.py's cut-off run): the
    JSON report's `open_loop` and `goodput` carry exactly the keys pinned here, which are the ones
    docs/measurement.md's schema lists, and say what the warmup left out."""
    from rampwatch.drivers.run.recording import Recorder
    from tests.test_arrivals import cut_off_run

    header, events = cut_off_run()
    path = tmp_path / "open.jsonl"
    rec = Recorder(path, header)
    for e in events:
        rec.write(e)
    rec.close()
    out = rw("report", str(path), "--format", "json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert set(rep["open_loop"]) == OPEN_LOOP_KEYS == documented_keys("open_loop")
    assert set(rep["goodput"]) == GOODPUT_KEYS == documented_keys("goodput")
    assert rep["open_loop"]["warmup"] == rep["goodput"]["warmup"] == "the first 1 conversations"
    assert rep["goodput"]["warmup_turns"] == 2


def test_report_json_schema(recorded):
    _, out = recorded
    rep = json.loads(rw("report", str(out), "--format", "json").stdout)
    assert set(rep) == {
        "run",
        "sessions",
        "interference",
        "server",
        "turn_spread",
        "ttft_ratio_median",
        "one_shot",
        "servers",
        "servers_total",
        "roles",
        "client_lag_max_ms",
        "client_lag_own_max_ms",
        "spans",
        "open_loop",
        "goodput",
        "reuse",
        "affinity",
        "client_workers",
        "workers",
    }
    assert rep["workers"] is None  # one driver: no workers to list
    assert rep["affinity"] is None  # one server: no turn's backend to tell
    (loop,) = rep["client_workers"]  # one driver: its loop's lag and CPU, of no worker
    assert set(loop) == documented_keys("client_workers") and loop["worker"] is None and loop["cpu_s"] >= 0
    assert set(rep["run"]) == {
        "schema",
        "rampwatch_version",
        "server",
        "model",
        "engine",
        "started_at",
        "sessions",
        "status",
        "lockstep",
        "needle_mode",
        "one_shot",
        "time_limit_s",
        "extra_body",
        "request_headers",
        "prompts",
        "reasoning",
        "max_tokens",
        "output_tokens",
        "time_scale",
        "trace",
    }
    assert rep["run"]["schema"] == 11 and rep["run"]["sessions"] == 2 and rep["run"]["engine"] == "rampwatch-sim"
    assert rep["run"]["status"] == "done" and rep["one_shot"] is None
    turn_keys = {
        "turn",
        "context_tokens",
        "new_tokens",
        "cached_tokens",
        "ttft_s",
        "prefill_tok_s",
        "decode_tok_s",
        "output_tokens",
        "hit_rate",
        "kv_peak",
        "needle",
        "error",
        "gap_p50_s",
        "gap_p99_s",
        "gap_max_s",
        "gaps_over_100ms",
        "gaps_over_1s",
        "client_busy",
        "client_busy_own",
        "think_s",
        "ttfa_s",
        "reasoning_tokens",
        "answer_tokens",
        "no_answer",
        "engine_prefill_s",
        "queued_s",
        "ttft_rest_s",
        "engine_ttft_s",
        "ttft_front_end_s",
        "ttft_client_s",
        "spec_accepted",
        "spec_drafted",
        "transferred_tokens",
        "prefill_leg_s",
        "transfer_s",
        "engine_decode_s",
        "engine_timing",
        "span_disagreement_s",
        "tpot_s",
        "due_s",
        "sent_s",
        "send_lag_s",
        "late",
        "ttft_from_due_s",
        "ttfa_from_due_s",
        "e2e_s",
        "e2e_from_due_s",
        "slo_met",
        "ideal_cached_tokens",
        "ideal_cached_pool_tokens",
        "cache_efficiency",
        "cache_efficiency_pool",
        "served_by",
        "served_by_source",
    }
    gap_keys = {"count", "p50_s", "p99_s", "max_s", "over_100ms", "over_1s"}
    for s in rep["sessions"]:
        assert set(s) == {"id", "turns", "summary", "affinity"} and s["affinity"] is None
        assert set(s["summary"]) == {
            "ttft_sum_s",
            "ttft_max_s",
            "decode_tok_s_median",
            "needle_found",
            "needle_no_answer",
            "reasoning_tokens",
            "ttfa_sum_s",
            "turns",
            "planned_turns",
            "reached_turn",
            "gaps_alone",
            "gaps_during_foreign_prefill",
            "queued_sum_s",
            "engine_prefill_sum_s",
            "front_end_sum_s",
            "client_sum_s",
        }
        assert s["summary"]["reached_turn"] == s["summary"]["planned_turns"] == 10
        assert set(s["summary"]["gaps_alone"]) == gap_keys
        assert len(s["turns"]) == 10
        for t in s["turns"]:
            assert set(t) == turn_keys
            assert 0 <= t["hit_rate"] <= 1 and 0 <= t["kv_peak"] <= 1
            gaps = (t["gap_max_s"], t["gap_p99_s"], t["gap_p50_s"])  # none: the reply came in one read
            assert gaps == (None, None, None) or gaps[0] >= gaps[1] >= gaps[2] >= 0
    assert set(rep["interference"]) == {
        "decode_tok_s_alone_median",
        "decode_tok_s_during_foreign_prefill_median",
        "overlapping_turns",
        "gaps_alone",
        "gaps_during_foreign_prefill",
        "extra_wait_s",
        "extra_wait_queued_s",
    }
    assert set(rep["server"]) == {"kv_peak", "hit_rate_last_turn"}
    server_keys = {
        "name",
        "role",
        "engine",
        "answered_s",
        "prompt_tokens",
        "prompt_computed_tokens",
        "prefix_query_tokens",
        "prefix_hit_tokens",
        "generation_tokens",
        "preemptions",
        "hit_rate",
        "prefill_tok_s",
        "decode_tok_s",
        "kv_peak",
        "kv_capacity_tokens",
        "last_error",
        "transferred_tokens",
        "workers",
        "router_retries",
        "router_errors",
    }
    assert len(rep["servers"]) == 1 and set(rep["servers"][0]) == server_keys and rep["servers"][0]["role"] == "both"
    assert rep["servers_total"]["generation_tokens"] == rep["servers"][0]["generation_tokens"] > 0
    assert [r["name"] for r in rep["roles"]] == ["both"]
    for spread in rep["turn_spread"]:
        assert set(spread) == {"turn", "slowest_ttft_s", "fastest_ttft_s", "ratio", "extra_queued_s"}
        assert spread["ratio"] >= 1


def test_report_md_and_csv(recorded):
    _, out = recorded
    md = rw("report", str(out), "--format", "md").stdout
    assert md.startswith("## rampwatch report") and "| turn | context |" in md
    csv = rw("report", str(out), "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("session,turn,context_tokens") and len(csv) == 21


def test_replay_headless_prints_the_same_turn_lines(recorded):
    p, out = recorded
    replay = rw("replay", str(out), "--headless")
    assert replay.returncode == 0
    turn_lines = lambda text: [line for line in text.splitlines() if " turn " in line and "ctx" in line]  # noqa: E731
    assert turn_lines(replay.stdout) == turn_lines(p.stdout)


def test_schedule_over_max_model_len_is_refused_before_sending(sim):
    p = rw("run", sim.url, "--headless", "--no-record", "--gpu", "none")  # the seed ramp needs 1M; tiny takes 40K
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "max_model_len" in p.stderr and "--scale-to" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "http://127.0.0.1:9", "--headless", "--no-record"], "cannot reach"),
        (["run", "not-a-url", "--headless", "--no-record"], "not a URL"),
        (["run", "http://127.0.0.1:99999", "--headless", "--no-record"], "not a URL"),  # was a traceback
        (["run", "http://127.0.0.1:9", "--schedule", "64k,32k", "--headless"], "grow"),
        (["run", "http://127.0.0.1:9", "--scale-to", "lots", "--headless"], "not a token count"),
        (["report", "/nonexistent/x.jsonl"], "no such recording"),
        (["replay", "/nonexistent/x.jsonl", "--headless"], "no such recording"),
        (["replay", "x.jsonl", "--speed", "100"], "--speed"),
        (
            ["watch", "--prometheus", "http://127.0.0.1:9", "--prometheus-match", "job=vllm", "--headless"],
            "--prometheus-match: not PromQL label matchers",
        ),
        (
            ["watch", "--prometheus", "http://127.0.0.1:9", "--prometheus-gpu-match", "Hostname", "--headless"],
            "--prometheus-gpu-match: not PromQL",
        ),
        (["watch", "http://127.0.0.1:9", "--prometheus-match", 'job="vllm"', "--headless"], "need --prometheus URL"),
        (
            ["watch", "--prometheus", "http://127.0.0.1:9", "--headless", "--no-record"],
            "cannot reach Prometheus at http://127.0.0.1:9",
        ),
        (
            ["watch", "--prometheus", "http://p:9090", "--metrics-url", "http://e:8000/metrics", "--gpu", "none"],
            "would read nothing",
        ),
        (
            [
                "watch",
                "--prometheus",
                "http://p:9090",
                "--metrics-url",
                "http://e:8000/metrics",
                "--prometheus-match",
                'job="a"',
            ],
            "use one",
        ),
        (
            [
                "watch",
                "--prometheus",
                "http://p:9090",
                "--gpu",
                "http://n:9400/metrics",
                "--prometheus-gpu-match",
                'job="a"',
            ],
            "use one",
        ),
        (["sim", "--tls-cert", "/nonexistent/cert.pem"], "--tls-cert and --tls-key go together"),
        (["sim", "--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"], "No such file"),
        (["sim", "--pd", "--tls-cert", "c.pem", "--tls-key", "k.pem"], "one engine or --replicas"),
        (["sim", "--port", "70000"], "--port 70000: 0 (free ports) or 1-65535"),
        (["sim", "--topology", "router", "--port", "65535"], "1-65533 (this topology listens on 3)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    p = rw(*args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and "Traceback" not in p.stderr


def test_sim_refuses_an_encrypted_key_in_one_line_without_asking_for_its_password(self_signed, tmp_path):
    """OpenSSL would ask for the key's password on the terminal (a sim under nohup would wait forever)."""
    key = tmp_path / "encrypted.pem"
    procs.run(["openssl", "genrsa", "-aes128", "-passout", "pass:x", "-out", str(key), "2048"], check=True)
    p = rw("sim", "--tls-cert", self_signed[0], "--tls-key", str(key), timeout=30)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "(unencrypted)" in p.stderr, p.stderr


def test_a_server_that_is_not_prometheus_is_refused_before_the_run(sim):
    p = rw("watch", "--prometheus", sim.url, "--headless", "--no-record")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"Prometheus at {sim.url}: HTTP 404, not a Prometheus API answer" in p.stderr


def test_unknown_model_and_non_openai_server(sim):
    p = rw("run", sim.url, "--model", "nope", "--scale-to", "8k", "--headless", "--no-record")
    assert p.returncode == 2 and "not served" in p.stderr and "sim-model" in p.stderr
    p = rw("run", sim.url + "/health", "--scale-to", "8k", "--headless", "--no-record")
    assert p.returncode == 2 and "not an OpenAI-compatible server" in p.stderr


def test_recording_path_problems(sim, tmp_path):
    p = rw("run", sim.url, "--scale-to", "8k", "--headless", "--record", str(tmp_path))
    assert p.returncode == 2 and "is a directory" in p.stderr and "--no-record" in p.stderr
    (tmp_path / "old.jsonl").write_text("x")
    p = rw("run", sim.url, "--scale-to", "8k", "--headless", "--record", str(tmp_path / "old.jsonl"))
    assert p.returncode == 2 and "already exists" in p.stderr
    assert (tmp_path / "old.jsonl").read_text() == "x"


def test_sim_command_binds_loopback_and_serves(tmp_path):
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = procs.Popen(
        [*rampwatch_cmd(), "sim", "--port", str(port), "--profile", "tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert models["data"][0]["owned_by"] == "rampwatch-sim"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert "SIMULATED" in out and "127.0.0.1" in out


def test_demo_headless_scaled_down(tmp_path):
    rec = tmp_path / "demo.jsonl"
    p = rw(
        "demo", "--headless", "--profile", "tiny", "--scale-to", "16k", "--output-tokens", "16", "--record", str(rec)
    )
    assert p.returncode == 0, p.stderr
    assert "needle ✓" in p.stdout and rec.exists()
    header = json.loads(rec.read_text().splitlines()[0])
    assert header["mode"] == "demo" and header["engine"] == "rampwatch-sim"


def test_demo_serves_its_sessions_metrics(tmp_path):
    """demo --serve-metrics: the per-session series, as run serves them, at the address asked for."""
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = procs.Popen(
        [
            *rampwatch_cmd(),
            "demo",
            "--headless",
            "--no-record",
            "--profile",
            "tiny",
            "--schedule",
            "1k,2k",
            "--output-tokens",
            "200",  # many steps: a decode rate needs more than one delivery, even when a loaded machine batches reads
            "--serve-metrics",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    done = ['session="s1",status="ok"} 2.0', 'session="s2",status="ok"} 2.0']
    text = ""
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(d in text for d in done):
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    finally:
        while proc.poll() is None:  # the run ends, then its figures linger: Ctrl-C leaves
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        out, err = proc.communicate(timeout=10)
    assert all(d in text for d in done), (text[-2000:], err)
    assert "rampwatch_ttft_seconds_count{" in text and "rampwatch_decode_tokens_per_second{" in text
    assert f"serving its own metrics on http://127.0.0.1:{port}/metrics" in err
