"""Paths a user takes that had no test: each fails when its behaviour is removed."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import Recording, read_recording
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.drivers.sim.serve import ChildSim
from rampwatch.drivers.telemetry.gpu import GpuSampler
from rampwatch.tui.sources import ReplaySource
from tests.conftest import drive, free_port, rw, rw_started, small_run
from tests.faults import run_scenario
from tests.simhost import TextServer, ThreadedSim
from tests.test_state_analysis import header, two_session_run


def test_api_key_file_reads_its_first_line(tmp_path):
    secret = "sk-from-a-file-123"
    key = tmp_path / "key"
    key.write_text(secret + "\n# the team's staging key\n")
    with ThreadedSim(make_profile("tiny"), api_key=secret) as s:
        ok = rw(
            *small_run(s.url, "--no-record", "--api-key-file", str(key), schedule="2k", output_tokens=4),
            env={"OPENAI_API_KEY": ""},
        )
        (tmp_path / "empty").write_text("\n")
        empty = rw("run", s.url, "--headless", "--no-record", "--api-key-file", str(tmp_path / "empty"))
        missing = rw("run", s.url, "--headless", "--no-record", "--api-key-file", str(tmp_path / "nope"))
    assert ok.returncode == 0, ok.stderr
    assert empty.returncode == 2 and "the file is empty" in empty.stderr
    assert missing.returncode == 2 and "No such file" in missing.stderr
    assert "first line" in rw("run", "--help").stdout


def test_stagger_delays_each_session_start(sim, tmp_path):
    run = drive(sim.url, sessions=3, stagger=0.7, schedule=[2000], output_tokens=8, record=tmp_path / "st.jsonl")
    events = read_recording(tmp_path / "st.jsonl").events
    sent = {e.session: e.t for e in events if isinstance(e, ev.RequestSent)}
    assert run.exit_code == 0
    # Session k starts (k - 1) x 0.7 s after the sessions are planned (the probe and calibration come before, and
    # take what a busy machine makes them take): lower bounds on the run's clock, and the order, never a window.
    planned = max(e.t for e in events if isinstance(e, ev.SessionPlanned))
    assert sent["s1"] < sent["s2"] < sent["s3"], sent
    assert sent["s2"] >= planned + 0.7 - 1e-3 and sent["s3"] >= planned + 1.4 - 1e-3, (planned, sent)


def test_replay_speed_scales_playback_and_is_range_checked(tmp_path):
    src = ReplaySource(Recording(header=header(), events=two_session_run()), speed=4.0)
    src.tick(0.5)
    assert src.position == pytest.approx(2.0)
    src.change_speed(1)
    assert src.speed == 8.0
    rec = tmp_path / "r.jsonl"
    rec.write_text('{"type":"header","schema":1,"rampwatch_version":"0","command":[],"mode":"run","server":"s"}\n')
    bad = rw("replay", str(rec), "--speed", "100")
    assert bad.returncode == 2 and "--speed" in bad.stderr


def test_several_metrics_urls_are_summed_and_kept_apart():
    with ThreadedSim(make_profile("tiny")) as a, ThreadedSim(make_profile("tiny")) as b:
        run = drive(
            a.url,
            schedule=[2000, 4000],
            output_tokens=16,
            metrics_urls=[a.url + "/metrics", b.url + "/metrics"],
            keep_events=True,
        )
    sources = {e.source for e in run.hub.events if isinstance(e, ev.MetricsSample)}
    assert sources == {u.removeprefix("http://") for u in (a.url, b.url)}  # each source by its name: host:port
    capacity = make_profile("tiny").kv_tokens
    assert run.state.server.values["kv_capacity_tokens"] == 2 * capacity  # counters and sizes add up over sources


DCGM = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="node1"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H200",Hostname="node1"} 12
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="node1"} 40960
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="node1"} 102400
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="node1"} 512.5
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="node1"} 1980
"""


async def test_dcgm_exporter_over_http():
    got: list[ev.AnyEvent] = []
    with TextServer(lambda path: DCGM) as exporter:
        sampler = GpuSampler(
            f"http://{exporter.host}/metrics", 0.05, got.append, lambda: 0.0, headers={"Authorization": "Bearer k"}
        )
        task = asyncio.create_task(sampler.run())
        deadline = time.monotonic() + 30  # a first sample, however busy the machine: no fixed window
        while not any(isinstance(e, ev.GpuSample) for e in got) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        task.cancel()
    sample = next(e for e in got if isinstance(e, ev.GpuSample))
    assert exporter.auth_on("/metrics") == {"Bearer k"}  # the headers it is given (the metrics sources' own token)
    assert {g.node for g in sample.gpus} == {"node1"}  # dcgm-exporter's Hostname label
    g0, g1 = sample.gpus
    assert (g0.index, g0.name, g0.util, g0.power, g0.sm_clock) == (0, "NVIDIA H200", 87.0, 512.5, 1980.0)
    assert g0.mem_used == 40960 * 2**20 and g0.mem_total == (40960 + 102400) * 2**20 and g1.util == 12.0


def test_reconnect_timeout_expiring_ends_the_sessions_as_gone(tmp_path):
    def kill(holder, run):
        from tests.faults import wait_then

        wait_then(0.5, lambda h, r: h["sim"].__exit__())(holder, run)

    out = run_scenario("gone", tmp_path, time_scale=0.1, during=kill, reconnect_timeout=2.0)
    said = [e for e in out.run.hub.events if isinstance(e, ev.Notice)]
    notices = " ".join(e.message for e in said)
    assert out.exit_code == 1 and "server still gone after 2s" in notices and "did not come back" in notices
    assert out.turns_lost > 0 and out.events_lost == 0
    # On the run's own clock, each session gave up no sooner than the reconnect timeout after losing the server.
    for sid in ("s1", "s2"):
        lost = next(e.t for e in said if e.session == sid and "server unreachable" in e.message)
        gave_up = next(e.t for e in said if e.session == sid and "still gone" in e.message)
        assert gave_up >= lost + 2.0, (sid, lost, gave_up)


def recorded_after(rec: Path, kind: str, after: str | None = None, timeout: float = 60.0) -> None:
    """Wait until the recording being written at `rec` holds a `kind` event (after the first `after` event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = rec.read_text() if rec.exists() else ""
        start = text.find(f'"{after}"') if after else 0
        if start >= 0 and f'"{kind}"' in text[start:]:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {kind} recorded" + (f" after a {after}" if after else "") + f" in {timeout:.0f} s")


def test_watch_follows_a_server_that_goes_and_comes_back(tmp_path):
    rec = tmp_path / "watch.jsonl"
    port = free_port()
    sim = ThreadedSim(make_profile("tiny"), port=port).__enter__()
    p = rw_started("watch", sim.url, "--headless", "--gpu", "none", "--scrape-interval", "0.2", "--record", str(rec))
    try:
        # Each step waits for what the recording says, never for a fixed time: a busy machine only makes it slower.
        recorded_after(rec, "MetricsSample")
        sim.__exit__()
        recorded_after(rec, "MetricsError")
        sim = ThreadedSim(make_profile("tiny"), port=port).__enter__()
        recorded_after(rec, "MetricsSample", after="MetricsError")  # the scraper backs off, then finds it again
    finally:
        p.terminate()
        p.communicate(timeout=30)
        sim.__exit__()
    kinds = [type(e).__name__ for e in read_recording(rec).events if isinstance(e, (ev.MetricsSample, ev.MetricsError))]
    first_error = kinds.index("MetricsError")
    assert "MetricsSample" in kinds[:first_error] and "MetricsSample" in kinds[first_error:]
    assert p.returncode == 143


def test_a_proxied_url_is_refused_in_one_line_and_no_proxy_lets_it_through(sim):
    proxy = {"HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    refused = rw("run", sim.url, "--schedule", "2k", "--headless", "--gpu", "none", "--no-record", env=proxy)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "would go through the proxy http://127.0.0.1:9" in refused.stderr and "NO_PROXY" in refused.stderr
    bypass = {**proxy, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    ok = rw(*small_run(sim.url, "--no-record", schedule="2k", output_tokens=4), env=bypass)
    assert ok.returncode == 0, ok.stderr


def test_tls_one_configuration_for_probes_and_stream(self_signed, tmp_path):
    """The simulated engine serving https (--tls-cert, --tls-key, in its own process): every request of a run
    trusts one configuration (that the stream's reads are kernel-stamped over TLS is test_chat.py's)."""
    cert, key = self_signed
    args = ["--schedule", "2k,4k", "--output-tokens", "8", "--headless", "--gpu", "none"]
    with ChildSim(argparse.Namespace(profile="tiny", tls_cert=cert, tls_key=key)) as s:
        assert s.url.startswith("https://")
        untrusted = rw("run", s.url, *args, "--no-record")
        trusted = rw("run", s.url, *args, "--ca-bundle", cert, "--record", str(tmp_path / "ok.jsonl"))
        insecure = rw("run", s.url, *args, "--insecure", "--record", str(tmp_path / "insecure.jsonl"))
        missing = rw("run", s.url, *args, "--no-record", "--ca-bundle", str(tmp_path / "nope.pem"))
    assert untrusted.returncode == 2 and "TLS certificate is not trusted" in untrusted.stderr
    assert untrusted.stderr.count("\n") == 1 and "--ca-bundle" in untrusted.stderr
    assert trusted.returncode == 0, trusted.stderr
    back = read_recording(tmp_path / "ok.jsonl")
    assert back.header.tls_verified and sum(isinstance(e, ev.TurnDone) and e.status == "ok" for e in back.events) == 2
    assert any(isinstance(e, ev.MetricsSample) for e in back.events)  # /metrics read over the same TLS
    assert insecure.returncode == 0 and "TLS NOT VERIFIED" in insecure.stdout
    back = read_recording(tmp_path / "insecure.jsonl")
    assert not back.header.tls_verified and any(
        isinstance(e, ev.Notice) and "NOT verified" in e.message for e in back.events
    )
    assert any(isinstance(e, ev.MetricsSample) for e in back.events)
    assert missing.returncode == 2 and "--ca-bundle" in missing.stderr
