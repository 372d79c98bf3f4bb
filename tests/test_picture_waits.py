"""A turn's wait drawn as the engine accounts for it (issue 19): in `rampwatch export`'s timeline, a turn the
engine timed shows the client's rest, then its time queued in the engine (hatched), then the engine's prefill
(solid) ending at the first token, so a lockstep run shows one session's turn queued behind the other's prefill."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import report_json, rw
from tests.test_export import VLLM, browse


def timed_demo(tmp: Path, time_scale: str = "5") -> Path:
    """`rampwatch demo`: two sessions in lockstep against the simulated engine in its own process, which times
    each request as vLLM's --enable-per-request-metrics does; the recording. At `time_scale` 5 each turn's
    prefill lasts about a second."""
    rec = tmp / "demo.jsonl"
    args = ("--schedule", "8k,16k,24k", "--time-scale", time_scale, "--output-tokens", "8", "--record", str(rec))
    p = rw("demo", "--headless", *args)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return rec


WAIT_RECT = re.compile(
    r'<rect class="wait-(rest|queued|prefill)" x="([\d.]+)" y="\d+" width="([\d.]+)"[^>]*><title>(s\d) turn (\d+):'
)
TICK = re.compile(r'class="tick" x="([\d.]+)"[^>]*>(\d+):(\d\d):(\d\d)<')


def seconds_per_pixel(svg: str) -> float:
    """The time axis's scale, read from its first and last labelled ticks."""
    ticks = [(float(x), int(h) * 3600 + int(m) * 60 + int(s)) for x, h, m, s in TICK.findall(svg)]
    (x0, t0), (x1, t1) = ticks[0], ticks[-1]
    return (t1 - t0) / (x1 - x0)


@pytest.fixture(scope="module")
def timed_recording(tmp_path_factory) -> Path:
    """One timed lockstep demo for this module's tests (each run costs a few seconds)."""
    return timed_demo(tmp_path_factory.mktemp("timed"))


def test_the_slower_sessions_turn_is_drawn_queued_behind_the_others_prefill(tmp_path, timed_recording):
    rec = timed_recording
    svg_path = tmp_path / "run.svg"
    assert rw("export", str(rec), "--svg", str(svg_path)).returncode == 0
    svg = svg_path.read_text()
    per_px = seconds_per_pixel(svg)
    drawn: dict[tuple[str, int, str], tuple[float, float]] = {}  # (session, turn, part): (start s, length s)
    for part, x, width, session, turn in WAIT_RECT.findall(svg):
        drawn[(session, int(turn), part)] = (float(x) * per_px, float(width) * per_px)
    rows: dict[int, list[dict]] = {}
    for sess in report_json(rec)["sessions"]:
        for t in sess["turns"]:
            rows.setdefault(t["turn"], []).append({**t, "session": sess["id"]})
    assert sorted(rows) == [1, 2, 3]
    pixel = 1.0 * per_px  # the picture rounds to a tenth of a pixel and draws nothing thinner than half of one
    for turn, pair in rows.items():
        fast, slow = sorted(pair, key=lambda r: r["ttft_s"])
        slow_start, slow_queued = drawn[(slow["session"], turn, "queued")]
        fast_start, fast_prefill = drawn[(fast["session"], turn, "prefill")]
        assert slow_queued == pytest.approx(slow["queued_s"], abs=pixel), (turn, slow)
        assert fast_prefill == pytest.approx(fast["engine_prefill_s"], abs=pixel), (turn, fast)
        # Queued behind the other's prefill: the two spans cover the same stretch of the run.
        overlap = min(slow_start + slow_queued, fast_start + fast_prefill) - max(slow_start, fast_start)
        assert overlap >= 0.8 * fast_prefill, (turn, slow_start, slow_queued, fast_start, fast_prefill)
        # The slow turn's own prefill follows its queue and ends at its first token.
        prefill_start, prefill_len = drawn[(slow["session"], turn, "prefill")]
        assert prefill_start == pytest.approx(slow_start + slow_queued, abs=pixel)
        assert prefill_len == pytest.approx(slow["engine_prefill_s"], abs=pixel)
    keys = re.findall(r'<g class="key">.*?</g>', svg)
    assert [k for k in keys if "then queued" in k and 'url(#rw-queued-hatch)"' in k]
    assert '<pattern id="rw-queued-hatch"' in svg and ">prefill<" not in svg


def test_the_html_export_renders_the_split_waits_in_a_real_browser(tmp_path, timed_recording):
    page = tmp_path / "run.html"
    assert rw("export", str(timed_recording), "--html", str(page), timeout=None).returncode == 0
    dom, log, shot = browse(page, tmp_path)
    # Two sessions, three turns each: every timed wait has its queued and prefill parts in the page as rendered.
    assert dom.count('class="wait-queued"') == 6 and dom.count('class="wait-prefill"') == 6, dom[:2000]
    assert '<pattern id="rw-queued-hatch"' in dom and "then queued" in dom
    assert "Uncaught" not in log and shot.exists() and shot.stat().st_size > 20_000


def test_a_recording_without_engine_figures_draws_its_waits_whole(tmp_path):
    # The shipped vLLM CPU recording: its server ran without --enable-per-request-metrics (the glm-like one's
    # demo timed every request).
    svg_path = tmp_path / "run.svg"
    assert rw("export", str(VLLM), "--svg", str(svg_path)).returncode == 0
    svg = svg_path.read_text()
    assert 'class="wait-' not in svg and "<pattern" not in svg and "queued in the engine" not in svg
    assert svg.count('class="prefill"') == 20 and ">prefill<" in svg
