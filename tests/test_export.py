"""Pictures of runs: self-contained HTML and SVG, checked in a real browser
(headless Chromium from Debian's packages; .ci/run installs it)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.history import MOST
from rampwatch.drivers.present import picture
from rampwatch.drivers.present.summary import summary_lines
from rampwatch.drivers.run.recording import read_recording
from tests import procs
from tests.conftest import missing, rampwatch_cmd, rw
from tests.folding import fold_state
from tests.test_state_analysis import turn_ok

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "recordings" / "glm-like-2x1m.sample.jsonl"
VLLM = ROOT / "recordings" / "vllm-cpu-2x32k.sample.jsonl"


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        missing("CHROMIUM", "no chromium on PATH (apt-get install chromium; .ci/run installs it)")
    return exe


def headless_chromium(tmp: Path) -> list[str]:
    """Headless Chromium with its own profile under `tmp`: the start of every browser command line here."""
    return [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp / 'profile'}",
    ]


def browse(page: Path, tmp: Path) -> tuple[str, str, Path]:
    """(the DOM after load, the browser's log, a screenshot) of `page` in headless Chromium."""
    base = [*headless_chromium(tmp), "--enable-logging=stderr", "--v=0"]
    dom = procs.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    shot = tmp / "shot.png"
    procs.run(
        [*base, "--window-size=1450,1000", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return dom.stdout, dom.stderr, shot


def test_export_is_small_and_self_contained(tmp_path):
    p = procs.run(
        [*rampwatch_cmd(), "export", str(GLM), "--html", str(tmp_path / "r.html"), "--svg", str(tmp_path / "r.svg")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    rec = read_recording(GLM)
    state = fold_state(rec.header, rec.events)
    page = picture.run_html(state, summary_lines(build_report(state)))
    for out in (tmp_path / "r.html", tmp_path / "r.svg"):
        text = out.read_text()
        assert out.stat().st_size < 5_000_000
        assert "<script" not in text and "<link" not in text and not re.search(r'(src|href)="https?://', text)
    assert page.count('class="lane"') == 2 and 'class="chart ttft"' in page


def test_export_renders_in_a_real_browser(tmp_path):
    page = tmp_path / "run.html"
    assert rw("export", str(GLM), "--html", str(page), timeout=None).returncode == 0
    dom, log, shot = browse(page, tmp_path)
    assert dom.count('class="lane"') == 2 and 'data-session="s1"' in dom and 'data-session="s2"' in dom
    # Every turn's prefill: the engine timed each (the demo), so it is drawn as its split's prefill part.
    assert dom.count('class="decode"') == 20 and dom.count('class="wait-prefill"') == 20 and 'class="foreign"' in dom
    assert ">KV cache<" in dom and ">prefix hit rate<" in dom and "TTFT against context" in dom
    assert "Uncaught" not in log and "SyntaxError" not in log
    assert shot.exists() and shot.stat().st_size > 20_000


def test_export_svg_renders_in_a_real_browser(tmp_path):
    svg = tmp_path / "run.svg"
    assert rw("export", str(GLM), "--svg", str(svg), timeout=None).returncode == 0
    dom, log, shot = browse(svg, tmp_path)
    assert dom.count('class="lane"') == 2 and 'class="chart ttft"' in dom and "Uncaught" not in log
    assert shot.exists() and shot.stat().st_size > 20_000


def test_compare_html_renders_in_a_real_browser(tmp_path):
    page = tmp_path / "cmp.html"
    p = procs.run(
        [*rampwatch_cmd(), "compare", str(GLM), str(VLLM), "--label", "glm", "--label", "vllm", "--html", str(page)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    dom, log, shot = browse(page, tmp_path)
    assert dom.count("<tr>") == 3 and ">glm<" in dom and ">vllm<" in dom
    assert dom.count('class="series"') == 2 and "Uncaught" not in log
    assert shot.exists() and shot.stat().st_size > 10_000


def test_export_needs_an_output():
    p = procs.run([*rampwatch_cmd(), "export", str(GLM)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "--html" in p.stderr


def long_run(sessions: int = 32, hours: float = 2.0, turns: int = 10) -> tuple:
    """A 2-hour, 32-session ramp to 1M tokens: turns spread over the run, metrics twice a second."""
    from rampwatch.drivers.model import events as ev
    from tests.test_state_analysis import header

    end = hours * 3600
    out: list = []
    schedule = [100_000 * (k + 1) for k in range(turns)]
    for k in range(sessions):
        sid = f"s{k + 1}"
        out.append(ev.SessionPlanned(t=0.0, session=sid, schedule=schedule, salt=sid))
        for turn in range(1, turns + 1):
            sent = (turn - 1) * end / turns + k * 3.0
            first = sent + 60.0 + 5 * k
            times = [first + 0.03 * i for i in range(128)]
            out += [
                ev.RequestSent(
                    t=sent,
                    session=sid,
                    turn=turn,
                    target_tokens=schedule[turn - 1],
                    new_tokens_est=100_000,
                    body_bytes=400_000,
                ),
                ev.FirstToken(t=first, session=sid, turn=turn),
                ev.TokenTimes(t=times[-1], session=sid, turn=turn, times=times),
                turn_ok(
                    times[-1],
                    sid,
                    turn,
                    prompt_tokens=schedule[turn - 1],
                    cached_tokens=schedule[turn - 1] - 100_000,
                    tokens=128,
                ),
            ]
    for i in range(int(end * 2)):
        out.append(
            ev.MetricsSample(
                t=i / 2,
                source="m",
                engine="vllm",
                values={
                    "kv_usage": (i % 7200) / 7200,
                    "running": 32,
                    "waiting": 0,
                    "prefix_queries": i * 100.0,
                    "prefix_hits": i * 90.0,
                },
            )
        )
    return header(), sorted(out, key=lambda e: e.t)


def test_a_two_hour_32_session_run_stays_small():
    """How fast it renders is tests/bench_export.py's figure (timing is not asserted on a shared machine)."""
    head, events = long_run()
    state = fold_state(head, events)
    page = picture.run_html(state, summary_lines(build_report(state)))
    assert len(page.encode()) < 5_000_000, len(page)
    assert page.count('class="lane"') == 32 and page.count('class="decode"') == 320
    assert max(len(p.split()) for p in re.findall(r'points="([^"]*)"', page)) <= MOST
