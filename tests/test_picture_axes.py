"""Pictures that read (issue 23): round ticks (1-2-5 steps, round run times), a unit on every axis, and a
legend whose keys each have their own label, laid out apart — checked in headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rampwatch.drivers.present.svg import clock_ticks, nice_step, nice_ticks
from tests import procs
from tests.conftest import rampwatch_cmd
from tests.test_export import GLM, ROOT, chromium

ROUND_MANTISSAS = {1, 2, 5}


def mantissa(step: float) -> int:
    return int(round(step / 10 ** int(f"{step:e}".split("e")[1])))


@pytest.mark.parametrize("top", [0.37, 1.0, 4.82, 19.3, 131_072.0, 917_504.0, 1_000_000.0, 7.0, 62.7, 114.8])
def test_ticks_are_round_steps_that_cover_the_data(top):
    ticks, end = nice_ticks(top)
    step = nice_step(top)
    assert mantissa(step) in ROUND_MANTISSAS
    assert ticks[0] == 0 and end >= top and end - step < top
    assert 2 <= len(ticks) <= 7
    assert all(abs(b - a - step) < 1e-9 * max(1.0, top) for a, b in zip(ticks, ticks[1:]))


@pytest.mark.parametrize("end", [20.0, 131.0, 600.0, 7300.0])
def test_run_time_ticks_fall_on_round_times(end):
    ticks = clock_ticks(end)
    assert ticks[0] == 0 and ticks[-1] <= end and 3 <= len(ticks) <= 7
    assert ticks[1] in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)


def exported_svg(tmp_path: Path) -> tuple[Path, str]:
    svg = tmp_path / "run.svg"
    p = procs.run(
        [*rampwatch_cmd(), "export", str(GLM), "--svg", str(svg)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    return svg, svg.read_text()


def test_the_exported_picture_names_every_unit_and_ticks_round_values(tmp_path):
    _, text = exported_svg(tmp_path)
    assert "run time (h:mm:ss)" in text and "context (tokens)" in text and "TTFT (s)" in text
    for label in re.findall(r'class="tick y"[^>]*>([^<]+)<', text):
        value = float(label.rstrip("KM")) * (1e3 if label.endswith("K") else 1e6 if label.endswith("M") else 1)
        assert value == 0 or mantissa(value) in ROUND_MANTISSAS | {3, 4, 6, 8} and value == float(f"{value:.2g}"), label
    clock_labels = re.findall(r'class="tick" [^>]*>(\d+):(\d\d):(\d\d)<', text)
    seconds = [int(h) * 3600 + int(m) * 60 + int(s) for h, m, s in clock_labels]
    assert len(seconds) >= 3 and all(s % seconds[1] == 0 for s in seconds)
    keys = re.findall(r'<g class="key">.*?</g>', text)
    assert len(keys) == 8 and all(k.count("<text") == 1 for k in keys)  # the timed waits split: 8 keys


PROBE = """<!DOCTYPE html><html><body>{svg}<pre id="out"></pre><script>
const boxes = [...document.querySelectorAll('.legend .key')].map(g => g.getBBox());
let overlaps = 0;
for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {{
  const a = boxes[i], b = boxes[j];
  if (a.x < b.x + b.width + 4 && b.x < a.x + a.width + 4 && a.y < b.y + b.height && b.y < a.y + a.height) overlaps++;
}}
document.getElementById('out').textContent = `keys=${{boxes.length}} overlaps=${{overlaps}}`;
</script></body></html>"""


def test_legend_keys_stand_apart_in_a_real_browser(tmp_path):
    exe = chromium()
    _, text = exported_svg(tmp_path)
    page = tmp_path / "probe.html"
    page.write_text(PROBE.format(svg=text))
    dom = procs.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "keys=8 overlaps=0" in dom, dom[-300:]
