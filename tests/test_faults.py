"""Faults, bad input and secrets: the run goes on, the recording keeps it."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.drivers.telemetry.gpu import GpuSampler
from tests.conftest import rw, rw_started, small_run
from tests.faults import BrokenNvml, FlakyFile, restart_server, run_scenario, wait_then
from tests.simhost import ThreadedSim


def notices(outcome) -> list[str]:
    return [e.message for e in outcome.run.hub.events if isinstance(e, ev.Notice)]


def wait_until(seen, timeout: float = 30.0) -> None:
    """Block the fault thread until `seen()` (what the run emitted says the fault took hold), however busy the
    machine: a fault held for a fixed window can end before a slow run ever meets it."""
    deadline = time.monotonic() + timeout
    while not seen():
        if time.monotonic() > deadline:
            raise AssertionError("the run never showed the fault")
        time.sleep(0.02)


def emitted(run: Run, kind: type, after: int = 0) -> int:
    """How many `kind` events the run emitted, past the first `after` events."""
    return sum(1 for e in list(run.hub.events)[after:] if isinstance(e, kind))


@pytest.mark.parametrize(
    "name,faults",
    [
        ("drop", SimFaults(drop_after_tokens=5, drop_requests=1)),
        ("http500", SimFaults(fail_requests=1, fail_status=500)),
        ("http503", SimFaults(fail_requests=1, fail_status=503)),
        ("error-chunk", SimFaults(error_after_tokens=3, error_requests=1)),
    ],
)
def test_failed_turn_is_recorded_and_the_other_session_goes_on(tmp_path, name, faults):
    out = run_scenario(name, tmp_path, faults)
    assert out.exit_code == 1 and out.events_lost == 0
    failed = [e for e in out.run.hub.events if isinstance(e, ev.TurnDone) and e.status == "failed"]
    assert len(failed) == 1 and failed[0].error
    # Only the turn the fault hit is lost: both sessions went on to their last turn.
    assert out.turns_lost == 1
    assert all(s.turn == len(out.run.cfg.schedule) for s in out.run.state.sessions.values())


@pytest.mark.parametrize(
    "faults", [SimFaults(drop_after_tokens=5, drop_requests=2), SimFaults(fail_requests=1, fail_status=503)]
)
def test_retries_recover_a_failed_turn(tmp_path, faults):
    out = run_scenario("retry", tmp_path, faults, retries=2)
    assert out.exit_code == 0 and out.turns_lost == 0 and out.events_lost == 0
    assert any("retry" in n for n in notices(out))


def test_server_gone_and_back(tmp_path):
    out = run_scenario(
        "restart", tmp_path, time_scale=0.1, during=restart_server(down_for=3.0, after=1.5), reconnect_timeout=30
    )
    assert out.exit_code == 0 and out.turns_lost == 0 and out.events_lost == 0
    said = " ".join(notices(out))
    assert "server unreachable" in said and "server back" in said
    assert any(isinstance(e, ev.MetricsError) for e in out.run.hub.events)  # the outage shows in the server panel too


def test_long_stall_before_first_byte_does_not_time_out(tmp_path):
    out = run_scenario("stall", tmp_path, SimFaults(stall_s=3.0, stall_requests=1), sessions=1)
    assert out.exit_code == 0 and out.turns_lost == 0
    assert max(r.ttft for r in out.run.state.turns) >= 3.0


def test_request_timeout_is_the_only_limit(tmp_path):
    out = run_scenario("timeout", tmp_path, SimFaults(stall_s=3.0, stall_requests=1), sessions=1, request_timeout=1.0)
    assert out.exit_code == 1
    assert "timed out" in out.run.state.turns[0].error


@pytest.mark.parametrize(
    "mode,expect", [("404", "HTTP 404"), ("malformed", "malformed exposition"), ("slow", "timed out")]
)
def test_metrics_faults_degrade_one_panel(tmp_path, mode, expect):
    # 'slow' needs a run longer than the scrape timeout (2 s).
    out = run_scenario(
        f"metrics-{mode}", tmp_path, SimFaults(metrics=mode), sessions=1, time_scale=0.1 if mode == "slow" else 0.5
    )
    assert out.exit_code == 0 and out.turns_lost == 0 and out.events_lost == 0
    errors = [e.error for e in out.run.hub.events if isinstance(e, ev.MetricsError)]
    assert errors and expect in errors[0]
    assert not any(isinstance(e, ev.MetricsSample) for e in out.run.hub.events)


def test_metrics_change_shape_mid_run(tmp_path):
    def flip(holder, run):
        wait_until(lambda: emitted(run, ev.MetricsSample) > 0)
        f = holder["sim"].sim.faults
        f.metrics = "malformed"
        wait_until(lambda: emitted(run, ev.MetricsError) > 0)
        f.metrics = "ok"

    out = run_scenario("metrics-flip", tmp_path, sessions=1, time_scale=0.2, during=wait_then(0.8, flip))
    assert out.exit_code == 0 and out.turns_lost == 0
    kinds = [type(e).__name__ for e in out.run.hub.events if isinstance(e, (ev.MetricsSample, ev.MetricsError))]
    first_error = kinds.index("MetricsError")
    assert "MetricsSample" in kinds[:first_error] and "MetricsSample" in kinds[first_error:]


def test_disk_full_mid_run_is_loud_and_loses_nothing(tmp_path):
    def fill_then_free(holder, run):
        disk = run.hub.recorder._file = FlakyFile(run.hub.recorder._file)
        disk.full = True
        wait_until(lambda: any("No space left" in e.message for e in list(run.hub.events) if isinstance(e, ev.Notice)))
        disk.full = False

    out = run_scenario("disk-full", tmp_path, sessions=1, time_scale=0.2, during=wait_then(0.5, fill_then_free))
    assert out.exit_code == 0 and out.turns_lost == 0
    said = " ".join(notices(out))
    assert "No space left" in said and "recording resumed" in said
    assert out.events_lost == 0


def test_disk_full_to_the_end_keeps_the_run_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(Run, "FINAL_WAIT_S", 1.0)  # the disk never frees: the run waits this long, then ends

    def fill(holder, run):
        run.hub.recorder._file = FlakyFile(run.hub.recorder._file, full=True)

    out = run_scenario("disk-full-end", tmp_path, sessions=1, time_scale=0.2, during=wait_then(0.3, fill))
    assert out.exit_code == 0 and out.recorded < out.emitted  # the file stops where the disk did
    assert out.run.state.recording_error and "No space left" in out.run.state.recording_error
    assert len(out.run.state.turns) == len(out.run.cfg.schedule)  # the live picture and report stay whole


def test_a_disk_full_at_the_end_gets_the_last_events_once_it_has_room(tmp_path):
    """The run ends while the disk is full: it waits for room instead of dropping what it holds."""

    def fill_until_after_the_end(holder, run):
        disk = run.hub.recorder._file = FlakyFile(run.hub.recorder._file, full=True)
        while not any(isinstance(e, ev.RunEnded) for e in list(run.hub.events)):
            time.sleep(0.05)
        time.sleep(1.5)
        disk.full = False

    out = run_scenario(
        "disk-full-at-end", tmp_path, sessions=1, time_scale=0.2, during=wait_then(0.3, fill_until_after_the_end)
    )
    assert out.exit_code == 0 and out.events_lost == 0 and out.recorded == out.emitted
    back = read_recording(tmp_path / "disk-full-at-end.jsonl")
    assert isinstance(back.events[-1], ev.RunEnded)


async def _sample(nvml) -> list[ev.AnyEvent]:
    """The sampler's first three readings (however long a busy machine takes to make them)."""
    got: list[ev.AnyEvent] = []
    task = asyncio.create_task(GpuSampler("auto", 0.05, got.append, lambda: 0.0, nvml=nvml).run())
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.02)
    task.cancel()
    return got


async def test_a_lost_gpu_degrades_the_gpu_panel():
    got = await _sample(BrokenNvml())  # every call raises NVMLError GPU_IS_LOST
    assert got and all(isinstance(e, ev.GpuUnavailable) and "NVML error" in e.reason for e in got)


async def test_unsupported_fields_are_empty_not_zero():
    class PowerUnsupported(BrokenNvml):
        """A consumer card: everything answers but power (NOT_SUPPORTED)."""

        class Util:
            gpu = 87

        class Mem:
            used, total = 40 * 2**30, 80 * 2**30

        def nvmlDeviceGetUtilizationRates(self, h):
            return self.Util()  # noqa: E704

        def nvmlDeviceGetMemoryInfo(self, h):
            return self.Mem()  # noqa: E704

        def nvmlDeviceGetName(self, h):
            return "NVIDIA Test"  # noqa: E704

        def nvmlDeviceGetClockInfo(self, h, kind):
            return 1980  # noqa: E704

        def nvmlDeviceGetTemperature(self, h, kind):
            return 61  # noqa: E704

        def nvmlDeviceGetPowerUsage(self, h):
            err = BrokenNvml.NVMLError("Not Supported")
            err.value = 3
            raise err

        nvmlDeviceGetEnforcedPowerLimit = nvmlDeviceGetPowerUsage

    got = await _sample(PowerUnsupported())
    g = next(e for e in got if isinstance(e, ev.GpuSample)).gpus[0]
    assert (g.name, g.util, g.mem_used, g.mem_total, g.sm_clock, g.temp) == (
        "NVIDIA Test",
        87,
        40 * 2**30,
        80 * 2**30,
        1980,
        61,
    )
    assert g.power is None and g.power_limit is None


async def test_no_nvml_means_no_gpu_source():
    if _has_nvml():
        pytest.skip("this machine has a working NVML; the no-driver path is what CPU machines exercise")
    got: list[ev.AnyEvent] = []
    await GpuSampler("auto", 0.05, got.append, lambda: 0.0).run()  # returns at once: nothing to sample
    assert isinstance(got[0], ev.GpuUnavailable) and "no GPU source" in got[0].reason


def _has_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:  # noqa: BLE001
        return False


# -- signals and kills: rampwatch as a subprocess ------------------------------------------


def _start_run(url: str, rec: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    run = small_run(
        url, "--sessions", "2", "--ignore-eos", "--record", str(rec), *extra, schedule="2k,4k,6k,8k", output_tokens=64
    )
    return rw_started(*run, env=env)


def _wait_for_first_turn(rec: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rec.exists() and b'"RequestSent"' in rec.read_bytes():
            return
        time.sleep(0.05)
    raise AssertionError("the run never sent a request")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_closes_the_recording_and_exits(tmp_path, sig, code):
    rec = tmp_path / "sig.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.05)) as s:
        p = _start_run(s.url, rec)
        _wait_for_first_turn(rec)
        time.sleep(0.5)
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    assert p.returncode == code, err
    back = read_recording(rec)
    assert not back.truncated_tail
    assert isinstance(back.events[-1], ev.RunEnded) and back.events[-1].status == "interrupted"
    assert any(isinstance(e, ev.TurnDone) and e.status == "cancelled" for e in back.events)
    assert "Traceback" not in err


def test_sigkill_at_random_moments_leaves_a_readable_file(tmp_path):
    rng = random.Random(1234)
    with ThreadedSim(make_profile("tiny", time_scale=0.2)) as s:
        for batch in range(4):  # 20 kills, five runs at a time
            runs = [(tmp_path / f"kill{batch}-{k}.jsonl") for k in range(5)]
            procs = [_start_run(s.url, rec) for rec in runs]
            for p, rec in zip(procs, runs):
                _wait_for_first_turn(rec)
                time.sleep(rng.uniform(0.0, 0.6))
                p.kill()
            for p, rec in zip(procs, runs):
                p.communicate(timeout=10)
                back = read_recording(rec)  # raises unless it reads up to its last complete line
                assert back.header.mode == "run"


# -- secrets -----------------------------------------------------------------------------


def test_api_key_and_url_credentials_never_reach_any_output(tmp_path):
    secret = "sk-test-DO-NOT-LEAK-1234567890"
    rec = tmp_path / "secret.jsonl"
    with ThreadedSim(make_profile("tiny"), api_key=secret) as s:
        url = s.url.replace("http://", "http://alice:hunter2pass@")
        p = rw(*small_run(url, "--record", str(rec), "--api-key-env", "MY_KEY"), env={"MY_KEY": secret}, timeout=60)
        assert p.returncode == 0, p.stderr
        bad_key = {"OPENAI_API_KEY": "bad"}
        wrong = rw("run", s.url, "--schedule", "2k", "--headless", "--no-record", env=bad_key, timeout=60)
    assert wrong.returncode == 2 and "HTTP 401" in wrong.stderr
    for text in (p.stdout, p.stderr, rec.read_text()):
        assert secret not in text and "hunter2pass" not in text and "Bearer" not in text
    assert "127.0.0.1" in rec.read_text()


def test_prompt_text_only_with_record_text(sim, tmp_path):
    plain, full = tmp_path / "plain.jsonl", tmp_path / "full.jsonl"
    for path, extra in ((plain, []), (full, ["--record-text"])):
        p = rw(*small_run(sim.url, "--record", str(path), *extra), timeout=60)
        assert p.returncode == 0, p.stderr
    assert "access code" not in plain.read_text()  # neither the needle's fact nor the question
    assert "access code" in full.read_text()
    planned = [e for e in read_recording(plain).events if isinstance(e, ev.SessionPlanned)][0]
    assert planned.salt and len(planned.needle_sha) == 64  # enough to regenerate and verify the conversation


# -- bad input at the command line --------------------------------------------------------------


def test_report_names_the_corrupt_line_and_can_skip_it(tmp_path, sim):
    rec = tmp_path / "r.jsonl"
    p = rw(*small_run(sim.url, "--record", str(rec)), timeout=60)
    assert p.returncode == 0
    lines = rec.read_bytes().split(b"\n")
    lines[3] = b"\x00garbage{"
    rec.write_bytes(b"\n".join(lines))
    bad = rw("report", str(rec), timeout=None)
    assert bad.returncode == 2 and ":4: corrupt line" in bad.stderr and "--skip-bad-lines" in bad.stderr
    assert bad.stderr.count("\n") == 1
    ok = rw("report", str(rec), "--skip-bad-lines", timeout=None)
    assert ok.returncode == 0 and "skipped corrupt lines: 4" in ok.stderr


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "empty file"),
        (b"id,ttft\n1,2\n", "not a rampwatch recording"),
        (
            b'{"type":"header","schema":%d,"rampwatch_version":"9","command":[],"mode":"run","server":"s"}\n'
            % (ev.SCHEMA + 1),  # one this rampwatch does not know yet
            "upgrade rampwatch",
        ),
    ],
)
def test_replay_and_report_refuse_non_recordings(tmp_path, content, message):
    f = tmp_path / "x.jsonl"
    f.write_bytes(content)
    for args in (["report", str(f)], ["replay", str(f), "--headless"]):
        p = rw(*args, timeout=None)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
