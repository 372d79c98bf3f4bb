"""`rampwatch export SWEEP.sweep.json` draws an open-loop sweep's capacity curve (issue 22): every point where
its recording puts it, each marked as the search judged it, the knee where the sweep file says, a legend that
reads in a real browser; a sweep it cannot draw gets one line and exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rampwatch.drivers.model.capacity import capacity_point, kept_share
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.tui.cli.files import load_state
from tests import procs
from tests.conftest import rw
from tests.simhost import ThreadedSim
from tests.test_export import ROOT, headless_chromium
from tests.test_picture_axes import PROBE


@pytest.fixture(scope="module")
def knee_sweep(tmp_path_factory) -> Path:
    """A three-point --find-max sweep of an engine that serves ~120 8K turns a minute: 40 and 80/min keep the
    SLO, 160/min does not (the knee test in test_sweep_open.py derives why)."""
    path = tmp_path_factory.mktemp("sweep") / "knee.sweep.json"
    profile = make_profile("fast", step_overhead_s=0.01, max_num_batched_tokens=164)
    flags = ["--find-max", "--arrivals", "40..160/min", "--max-points", "3", "--slo", "ttft=2s", "--seed", "5"]
    flags += ["--time-limit", "8s", "--grace", "2", "--schedule", "8k", "--output-tokens", "8", "--ignore-eos"]
    with ThreadedSim(profile) as sim:
        out = rw("sweep", sim.url, *flags, "--gpu", "none", "--record", str(path), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return path


def test_every_point_is_drawn_where_its_recording_puts_it_and_marked_as_judged(knee_sweep, tmp_path):
    svg, page = tmp_path / "cap.svg", tmp_path / "cap.html"
    out = rw("export", str(knee_sweep), "--svg", str(svg), "--html", str(page))
    assert out.returncode == 0, out.stderr
    text = svg.read_text()
    sweep = json.loads(knee_sweep.read_text())
    drawn = {
        float(m["offered"]): m
        for m in (dict(re.findall(r'data-(\w+)="([^"]*)"', g)) for g in re.findall(r'<g class="point" ([^>]*)>', text))
    }
    assert sorted(drawn) == sorted(sweep["arrivals_per_min"])
    for name in sweep["runs"]:
        state = load_state(knee_sweep.parent / name, skip_bad_lines=False)
        p = capacity_point(state)
        assert p is not None
        got = drawn[p.offered_per_min]
        assert float(got["achieved"]) == pytest.approx(p.turns_per_min)
        assert float(got["goodput"]) == pytest.approx(p.goodput_turns_per_min)
        assert float(got["p99"]) == pytest.approx(p.ttft_p99_per_128k_s)
        assert float(got["p50"]) == pytest.approx(p.ttft_p50_per_128k_s)
        judged = "saturated" if p.status == "saturated" else "kept" if kept_share(p, sweep["slo_share"]) else "missed"
        assert got["verdict"] == judged
    assert sweep["knee_per_min"] is not None, sweep
    assert f'data-knee="{sweep["knee_per_min"]:g}"' in text and f"knee {sweep['knee_per_min']:.4g}/min" in text
    for unit in ("offered rate (conversations/min)", "turns/min (achieved, goodput)", "TTFT per 128K new tokens (s)"):
        assert unit in text
    html = page.read_text()
    assert "<svg" in html and "sweep: one point per arrival rate (open loop)" in html and "knee:" in html


def test_the_legend_keys_stand_apart_in_a_real_browser(knee_sweep, tmp_path):
    svg = tmp_path / "cap.svg"
    assert rw("export", str(knee_sweep), "--svg", str(svg)).returncode == 0
    text = svg.read_text()
    keys = len(re.findall(r'<g class="key">', text))
    probe = tmp_path / "probe.html"
    probe.write_text(PROBE.format(svg=text))
    dom = procs.run(
        [*headless_chromium(tmp_path), "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert keys >= 6 and f"keys={keys} overlaps=0" in dom, dom[-300:]


def test_a_sweep_without_a_curve_gets_one_line_and_exit_2(knee_sweep, tmp_path):
    closed = tmp_path / "closed.sweep.json"
    closed.write_text(json.dumps({"type": "rampwatch-sweep", "schema": 2, "sessions": [1, 2], "runs": []}))
    missing = tmp_path / "missing.sweep.json"
    listed = json.loads(knee_sweep.read_text())
    missing.write_text(json.dumps({**listed, "runs": ["gone.jsonl"]}))
    for path, said in ((closed, "closed-loop sweep"), (missing, "gone.jsonl is missing")):
        out = rw("export", str(path), "--svg", str(tmp_path / "x.svg"))
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and said in lines[0], out.stderr
        assert not (tmp_path / "x.svg").exists()


def test_the_shipped_sample_sweep_draws_as_docs_replay_md_shows(tmp_path):
    """recordings/sim-knee.sweep.json, whose picture replay.md shows: every point drawn, the knee it names."""
    sample = ROOT / "recordings" / "sim-knee.sweep.json"
    out = rw("export", str(sample), "--svg", str(tmp_path / "cap.svg"))
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "cap.svg").read_text()
    sweep = json.loads(sample.read_text())
    assert text.count('<g class="point" ') == len(sweep["runs"]) == 5
    assert f"knee {sweep['knee_per_min']:.4g}/min" in text
