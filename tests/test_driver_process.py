"""The driver in its own process: the UI folds its stream, sees its death,
and stops it cleanly; a bug in a session is a crash (exit 3), never "done"."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rampwatch.drivers.client import session
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.run import pipe
from rampwatch.drivers.run.config import BadInput, RunConfig
from rampwatch.drivers.run.pipe import HEARTBEAT_S
from rampwatch.drivers.run.process import DriverProcess
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.tui.app import RampwatchApp
from rampwatch.tui.cli.files import load_state
from rampwatch.tui.cli.launch import export_from_ui
from rampwatch.tui.sources import LiveSource
from rampwatch.tui.widgets.events import EventsPanel
from rampwatch.tui.widgets.header import HeaderBar
from tests import procs
from tests.conftest import drive, free_port, rampwatch_cmd, rw, small_run
from tests.simhost import CaptureRelay, ThreadedSim

ROOT = Path(__file__).resolve().parents[1]

# Injected into the driver process through PYTHONPATH: session s1's turn 2 raises, as a bug would.
BOOM = textwrap.dedent("""
    from rampwatch.drivers.client import session

    _run_turn = session.SessionRunner.run_turn

    async def run_turn(self, turn):
        if self.sid == "s1" and turn == 2:
            raise RuntimeError("boom in a session task")
        return await _run_turn(self, turn)

    session.SessionRunner.run_turn = run_turn
""")


def config(url: str, rec: Path | None, **kw) -> RunConfig:
    opts = dict(
        schedule=[2000, 4000, 8000, 12000],
        output_tokens=64,
        ignore_eos=True,
        sessions=2,
        gpu="none",
        scrape_interval=0.2,
    )
    opts.update(kw)
    return RunConfig(url=url, metrics_urls=[url + "/metrics"], record=rec, **opts)


async def wait_for(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def live_ui(cfg: RunConfig):
    """A driver process for `cfg` behind a live UI under Pilot: yields (driver, source, app, pilot)."""
    driver = DriverProcess(cfg)
    driver.start()
    source = LiveSource(driver)
    app = RampwatchApp(source)
    async with app.run_test(size=(120, 40)) as pilot:
        yield driver, source, app, pilot


def decoding(source: LiveSource) -> bool:
    return any(x.state == "decoding" for x in source.state.sessions.values())


def screen_text(app: RampwatchApp) -> str:
    return app.query_one(HeaderBar).shown.plain + "\n" + app.query_one(EventsPanel).plain_text()


async def test_killing_the_driver_shows_crashed_in_the_ui_and_the_recording(tmp_path):
    rec = tmp_path / "killed.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.1)) as s:
        async with live_ui(config(s.url, rec)) as (driver, source, app, pilot):
            await wait_for(lambda: decoding(source))
            os.kill(driver.proc.pid, signal.SIGKILL)
            await wait_for(lambda: source.finished)
            await wait_for(lambda: "killed by SIGKILL" in screen_text(app))  # the next UI tick shows it
            shown = screen_text(app)
            await pilot.press("q")
        code = source.stop()  # on the loop's thread, as the app does once it has quit
    assert code == 3
    assert "crashed" in shown and "killed by SIGKILL" in shown
    back = read_recording(rec)
    assert not back.truncated_tail
    end = back.events[-1]
    assert isinstance(end, ev.RunEnded) and end.status == "crashed" and "SIGKILL" in (end.error or "")
    # Events the UI had received but the driver had not yet flushed were restored into the file.
    assert len(back.events) == source.state.version


async def test_quitting_the_ui_stops_the_driver_and_records_cancelled_turns(tmp_path):
    rec = tmp_path / "quit.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.05)) as s:
        async with live_ui(config(s.url, rec)) as (driver, source, app, pilot):
            await wait_for(lambda: decoding(source))
            await pilot.press("m")
            await wait_for(lambda: any(x.level == "mark" for x in source.state.log))  # the driver took the mark
            await pilot.press("q")
        code = source.stop()  # on the loop's thread, as the app does once it has quit
    assert code == 130 and driver.proc.returncode == 130
    back = read_recording(rec)
    assert isinstance(back.events[-1], ev.RunEnded) and back.events[-1].status == "interrupted"
    done = [e for e in back.events if isinstance(e, ev.TurnDone)]
    assert done and all(e.status == "cancelled" for e in done)
    assert any(isinstance(e, ev.Mark) for e in back.events)
    assert source.state.ended is not None and source.state.ended.status == "interrupted"


async def test_a_dead_uis_signal_then_its_closed_pipe_still_leave_a_finished_recording(tmp_path):
    """When the UI dies the driver hears twice: SIGTERM from the kernel, then end of input on its stdin, a loop
    turn or more apart. The second must not cancel the clean-up the first started (the recording would end
    without its RunEnded), nor change the exit code the first set."""
    rec = tmp_path / "twice.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.05)) as s:
        run = Run(config(s.url, rec), record=True)
        await run.prepare()
        drive = asyncio.create_task(run.drive())
        await wait_for(lambda: any(x.state == "decoding" for x in run.state.sessions.values()))
        run.interrupt(drive, signal.SIGTERM)
        for _ in range(50):  # the closed pipe, heard on each of the next turns of the loop
            await asyncio.sleep(0)
            run.interrupt(drive, None)
        code = await drive
    assert code == 143
    end = read_recording(rec).events[-1]
    assert isinstance(end, ev.RunEnded) and (end.status, end.exit_code) == ("interrupted", 143), end


@pytest.mark.serial  # asserts the stop took under 2 s
async def test_a_stop_while_the_run_writes_its_end_cuts_the_wait_short_and_keeps_the_end(tmp_path):
    """--otlp against an engine that exports no spans: the finished run waits for its last turns' spans. A quit
    then (the UI's Stop, a Ctrl-C) ends that wait at once and the recording still ends with the run's own end."""
    rec = tmp_path / "ending.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.05)) as s:
        run = Run(config(s.url, rec, schedule=[2000], otlp=f"127.0.0.1:{free_port()}"), record=True)
        await run.prepare()
        drive = asyncio.create_task(run.drive())
        await wait_for(lambda: run._ending)  # both turns done: waiting for spans that never come
        started = time.monotonic()
        run.interrupt(drive, None)
        code = await drive
    assert code == 0 and time.monotonic() - started < 2.0
    end = read_recording(rec).events[-1]
    assert isinstance(end, ev.RunEnded) and end.status == "done", end


async def test_with_the_ui_its_process_serves_the_runs_figures(tmp_path):
    """--serve-metrics with the UI: the driver's events reach the UI process's exporter, which still
    serves the final figures after the run; they equal the recording's report."""
    rec = tmp_path / "exported.jsonl"
    cfg = config(rec=rec, url="", serve_metrics=f"127.0.0.1:{free_port()}")
    with ThreadedSim(make_profile("tiny")) as s:
        cfg.url, cfg.metrics_urls = s.url, [s.url + "/metrics"]
        driver = DriverProcess(cfg)
        driver.start()
        exporter = export_from_ui(cfg, driver)
        assert exporter is not None
        try:
            source = LiveSource(driver)
            async with RampwatchApp(source).run_test(size=(120, 40)) as pilot:
                await wait_for(lambda: source.finished, timeout=60)
                async with httpx.AsyncClient() as client:
                    text = (await client.get(f"http://127.0.0.1:{exporter.port}/metrics")).text
                await pilot.press("q")
            assert source.stop() == 0
        finally:
            exporter.close()
    samples = {
        (m.name, m.labels.get("session"), m.labels.get("status")): m.value
        for family in text_string_to_metric_families(text)
        for m in family.samples
    }
    rep = build_report(load_state(rec, skip_bad_lines=False))
    assert len(rep.sessions) == 2
    for sess in rep.sessions:
        assert samples[("rampwatch_ttft_seconds_sum", sess.id, None)] == pytest.approx(
            sess.summary.ttft_sum_s, abs=1e-9
        )
        assert samples[("rampwatch_turns_total", sess.id, "ok")] == len(sess.turns) == 4
        assert samples[("rampwatch_context_tokens", sess.id, None)] == sess.turns[-1].context_tokens


def test_live_state_equals_the_replay_of_its_recording(tmp_path, sim):
    # Stopped at once: the state folded from the stream, the recording and the process itself agree on the end.
    rec = tmp_path / "whole.jsonl"
    driver = DriverProcess(config(sim.url, rec))
    driver.start()
    code = driver.stop(signal.SIGTERM)  # drains the stream; the run may have finished already
    assert code in (0, 143) and driver.proc.returncode == code  # the OS's word, not the stream's
    ended = read_recording(rec).events[-1]
    assert isinstance(ended, ev.RunEnded) and ended.exit_code == code
    assert ended.status == ("interrupted" if code == 143 else "done"), ended
    stopped = load_state(rec, skip_bad_lines=False)
    assert build_report(driver.state) == build_report(stopped) and driver.state.version == stopped.version
    # Followed to its end by a UI loop: every recorded event reached the UI, and no other.
    driver = DriverProcess(config(sim.url, tmp_path / "whole2.jsonl"))
    driver.start()

    async def follow() -> None:
        driver.attach(asyncio.get_running_loop())
        await wait_for(lambda: driver.finished, timeout=60)

    asyncio.run(follow())
    assert driver.stop() == 0 and driver.proc.returncode == 0
    assert all(r.status == "ok" for r in driver.state.turns) and len(driver.state.turns) == 2 * 4
    replayed = load_state(tmp_path / "whole2.jsonl", skip_bad_lines=False)
    assert build_report(driver.state) == build_report(replayed)
    assert driver.state.version == replayed.version  # every recorded event reached the UI, and no other


def test_a_probe_slower_than_a_heartbeat_still_hands_the_run_over(sim):
    """The driver's heartbeat starts after its handshake: a server that takes seconds to answer the probe
    and calibration (a slow link) once had a heartbeat reach the UI first, which took it for a bad handshake."""
    with CaptureRelay(sim.url, connect_delay_s=HEARTBEAT_S * 1.5) as slow_link:
        driver = DriverProcess(config(slow_link.url, None, schedule=[2000]), record=False)
        driver.start()
        assert driver.state is not None and driver.state.header is not None
        assert driver.stop(signal.SIGTERM) in (0, 143)


def test_bad_input_is_found_before_the_ui_opens(tmp_path, sim):
    driver = DriverProcess(config(sim.url, None, model="no-such-model"), record=False)
    with pytest.raises(BadInput, match="'no-such-model' is not served"):
        driver.start()
    assert driver.proc.returncode == 2
    p = procs.run(
        [*rampwatch_cmd(), "run", "http://127.0.0.1:9", "--gpu", "none", "--no-record"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 2 and "cannot reach http://127.0.0.1:9" in p.stderr and "Traceback" not in p.stderr


def test_a_session_task_that_raises_ends_the_run_as_crashed(tmp_path, sim, monkeypatch):
    async def run_turn(self, turn):
        if self.sid == "s1" and turn == 2:
            raise RuntimeError("boom in a session task")
        return await original(self, turn)

    original = session.SessionRunner.run_turn
    monkeypatch.setattr(session.SessionRunner, "run_turn", run_turn)
    run = drive(sim.url, sessions=2, schedule=[2000, 4000, 8000], output_tokens=16, record=tmp_path / "boom.jsonl")
    assert run.exit_code == 3
    end = read_recording(tmp_path / "boom.jsonl").events[-1]
    assert isinstance(end, ev.RunEnded) and (end.status, end.exit_code) == ("crashed", 3)
    assert end.error == "RuntimeError: boom in a session task"


async def test_a_session_task_that_raises_in_the_driver_process_shows_crashed(tmp_path, monkeypatch):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(BOOM)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "inject"))
    rec = tmp_path / "boom.jsonl"
    with ThreadedSim(make_profile("tiny")) as s:
        async with live_ui(config(s.url, rec)) as (driver, source, app, pilot):
            await wait_for(lambda: source.finished)
            await wait_for(lambda: "CRASHED" in screen_text(app))  # the next UI tick shows it
            shown = screen_text(app)
            await pilot.press("q")
        code = source.stop()  # on the loop's thread, as the app does once it has quit
    assert code == 3 and driver.proc.returncode == 3
    assert "CRASHED: RuntimeError: boom in a session task" in shown
    end = read_recording(rec).events[-1]
    assert (
        isinstance(end, ev.RunEnded) and end.status == "crashed" and end.error == "RuntimeError: boom in a session task"
    )
    assert "Traceback" in driver.stderr_text()  # the details stay in the driver's stderr, shown after the UI


def test_headless_crash_exits_3_with_one_line(tmp_path, sim):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(BOOM)
    p = rw(*small_run(sim.url, "--no-record"), env={"PYTHONPATH": str(tmp_path / "inject")}, timeout=60)
    assert p.returncode == 3
    assert "rampwatch: crashed: RuntimeError: boom in a session task" in p.stderr


def test_the_wheel_installs_only_the_rampwatch_namespace(tmp_path):
    p = procs.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    wheel = next(tmp_path.glob("rampwatch-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"rampwatch", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "rampwatch/tui/app.tcss" in names and "rampwatch/drivers/run/child.py" in names


async def test_a_hung_driver_is_shown_silent_and_killed_at_stop(tmp_path):
    rec = tmp_path / "hung.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.1)) as s:
        async with live_ui(config(s.url, rec)) as (driver, source, app, pilot):
            await wait_for(lambda: decoding(source))
            os.kill(driver.proc.pid, signal.SIGSTOP)  # alive, but its loop no longer turns
            await wait_for(lambda: "driver silent" in source.mode(), timeout=10)
            await wait_for(lambda: "driver silent" in app.query_one(HeaderBar).shown.plain)  # the next UI tick
            shown = app.query_one(HeaderBar).shown.plain
        code = source.driver.stop(None, 1.0)
    assert "driver silent" in shown
    assert code == 3
    end = read_recording(rec).events[-1]
    assert isinstance(end, ev.RunEnded) and end.status == "crashed" and "hung" in (end.error or "")


def test_the_ui_keeps_only_the_lines_the_recording_lacks_and_restores_them(tmp_path):
    """The UI's copy of the stream is trimmed to what the driver has not yet written (so it stays
    small over hours), and after a crash exactly the missing lines are appended, in order."""
    rec = tmp_path / "partial.jsonl"
    driver = DriverProcess(config("http://127.0.0.1:9", rec))
    driver.recording = rec
    lines = [pipe.encode(ev.Mark(t=float(i), note=f"m{i}")) for i in range(3000)]
    rec.write_bytes(b'{"type":"header"}\n' + b"\n".join(lines[:2500]) + b"\n" + lines[2500][:7])  # a torn last line
    for line in lines:
        driver._on_line(line)
    assert len(driver._unwritten) <= 3000 - 2048 and driver._unwritten_first >= 2048
    driver._complete_recording(ev.RunEnded(t=3000.0, status="crashed", exit_code=3, error="killed"))
    back = rec.read_bytes().splitlines()
    assert back[1:3001] == lines and back[-1] == pipe.encode(
        ev.RunEnded(t=3000.0, status="crashed", exit_code=3, error="killed")
    )
