"""SGLang's surface, simulated (issue 14): SGLang has no CPU build this project
can install, so the simulated engine speaks its HTTP and metrics surface
(`rampwatch sim --flavor sglang`) and the whole path runs end to end: probe,
engine detection, panels, the unavailable hit rate and why, the report."""

from __future__ import annotations

import asyncio
import json

import httpx

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.drivers.telemetry.metrics import normalize
from rampwatch.tui.app import RampwatchApp
from rampwatch.tui.sources import ReplaySource
from rampwatch.tui.widgets.server import ServerPanel
from tests import procs
from tests.conftest import DATA, drive, rampwatch_cmd
from tests.simhost import ThreadedSim


def series_names(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_the_sglang_flavour_serves_sglangs_names_and_endpoints():
    with ThreadedSim(make_profile("tiny"), flavor="sglang") as s:
        text = httpx.get(s.url + "/metrics").text
        info = httpx.get(s.url + "/get_server_info").json()
        model = httpx.get(s.url + "/get_model_info").json()
        owned = httpx.get(s.url + "/v1/models").json()["data"][0]["owned_by"]
    # Every series it serves is one a real SGLang serves: in the captures, or (newer than them) defined in
    # SGLang 0.5's python/sglang/srt/metrics/collector.py. None is vLLM's, none is a _created series.
    newer = {
        "sglang:kv_used_tokens",
        "sglang:max_total_num_tokens",
        *(f"sglang:inter_token_latency_seconds_{x}" for x in ("bucket", "sum", "count")),
    }
    real = series_names((DATA / "sglang_metrics.txt").read_text()) | newer
    assert series_names(text) <= real, series_names(text) - real
    assert "sglang:cached_tokens_total" not in text and "_created" not in text and "vllm:" not in text
    assert 'engine_type="unified"' in text and 'tp_rank="0"' in text
    assert info["version"].endswith("-simulated") and info["simulated"] and model["simulated"] and owned == "sglang"
    engine, values, missing = normalize(text)
    assert engine == "sglang" and "kv_usage" in values and "running" in values
    assert missing["prefix_hits"].startswith("SGLang exposes no prefix-cache counters")


def test_a_ramp_against_the_sglang_flavour_end_to_end(tmp_path):
    rec = tmp_path / "sglang.jsonl"
    with ThreadedSim(make_profile("tiny"), flavor="sglang") as s:
        run = drive(s.url, sessions=2, schedule=[4000, 8000, 12000], output_tokens=16, ignore_eos=True, record=rec)
    assert run.exit_code == 0
    back = read_recording(rec)
    assert back.header.engine == "sglang" and back.header.engine_version.endswith("-simulated")
    rep = build_report(run.state)
    assert [s.summary.reached_turn for s in rep.sessions] == [3, 3]
    # No cached tokens in usage without --enable-cache-report, no hit counters: the hit rate is unavailable.
    turns = [t for s in rep.sessions for t in s.turns]
    assert all(t.cached_tokens is None and t.hit_rate is None for t in turns)
    assert panels.hit_rate_since_start(run.state) is None and rep.servers[0].hit_rate is None
    assert rep.servers[0].engine == "sglang" and rep.servers[0].generation_tokens == 2 * 3 * 16
    assert run.state.server.values["kv_capacity_tokens"] == make_profile("tiny").kv_tokens

    async def server_panel() -> str:
        src = ReplaySource(back)
        src.seek(back.events[-1].t)
        src.paused = True
        app = RampwatchApp(src, autostart=False)
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause(0.2)
            return app.query_one(ServerPanel).plain_text()

    shown = " ".join(asyncio.run(server_panel()).split())
    assert "unavailable: SGLang exposes no prefix-cache counters" in shown, shown
    assert "per-request cached tokens unavailable (SGLang: --enable-cache-report)" in shown


def test_enable_cache_report_puts_cached_tokens_in_usage():
    with ThreadedSim(make_profile("tiny"), flavor="sglang", cache_report=True) as s:
        run = drive(s.url, sessions=1, schedule=[4000, 8000], output_tokens=8, ignore_eos=True)
    rows = build_report(run.state).sessions[0].turns
    assert rows[0].cached_tokens == 0 and rows[1].cached_tokens > 3000 and rows[1].hit_rate > 0.4


def test_sim_flavor_sglang_on_the_command_line(tmp_path):
    p = procs.run(
        [
            *rampwatch_cmd(),
            "demo",
            "--flavor",
            "sglang",
            "--profile",
            "tiny",
            "--scale-to",
            "8k",
            "--output-tokens",
            "8",
            "--headless",
            "--record",
            str(tmp_path / "d.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "(sglang)" in p.stdout
    rep = json.loads(
        procs.run(
            [*rampwatch_cmd(), "report", str(tmp_path / "d.jsonl"), "--format", "json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert rep["run"]["engine"] == "sglang" and rep["servers"][0]["hit_rate"] is None
