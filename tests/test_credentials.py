"""The inference API key goes to the inference servers alone (issue 21): a metrics or GPU URL may be another
host, so it gets only its own credentials: --metrics-auth-env's Bearer token, or user:password@ in its URL."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
from tests.conftest import rampwatch_cmd, rw
from tests.simhost import TextServer, ThreadedSim
from tests.test_paths import DCGM

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "sk-inference-only-0123456789"
METRICS_TOKEN = "metrics-token-9876543210"
VLLM_METRICS = (ROOT / "tests" / "data" / "vllm-0.32.0-cpu-metrics.txt").read_text()


@pytest.fixture
def metrics_host() -> Iterator[TextServer]:
    """A host that is not the inference server: an engine's /metrics and a dcgm-exporter at /dcgm."""
    with TextServer(lambda path: DCGM if path == "/dcgm" else VLLM_METRICS) as host:
        yield host


def run_with(host: str, *extra: str, metrics_userinfo: str = "") -> subprocess.CompletedProcess:
    with ThreadedSim(make_profile("tiny"), api_key=API_KEY) as sim:
        return procs.run(
            [
                *rampwatch_cmd(),
                "run",
                sim.url,
                "--headless",
                "--no-record",
                "--schedule",
                "2k,4k",
                "--output-tokens",
                "8",
                "--api-key-env",
                "RW_INFERENCE_KEY",
                "--metrics-url",
                f"http://{metrics_userinfo}{host}/metrics",
                "--gpu",
                f"http://{metrics_userinfo}{host}/dcgm",
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            env={**os.environ, "RW_INFERENCE_KEY": API_KEY, "RW_METRICS_TOKEN": METRICS_TOKEN},
        )


def test_metrics_and_gpu_urls_never_get_the_inference_key(metrics_host):
    seen = metrics_host
    p = run_with(seen.host)
    assert p.returncode == 0, p.stderr
    assert seen.auth_on("/metrics") == {None} and seen.auth_on("/dcgm") == {None}
    assert API_KEY not in p.stdout + p.stderr


def test_metrics_auth_env_sends_its_own_token(metrics_host):
    seen = metrics_host
    p = run_with(seen.host, "--metrics-auth-env", "RW_METRICS_TOKEN")
    assert p.returncode == 0, p.stderr
    expected = {f"Bearer {METRICS_TOKEN}"}
    assert seen.auth_on("/metrics") == expected and seen.auth_on("/dcgm") == expected
    assert METRICS_TOKEN not in p.stdout + p.stderr


def test_a_metrics_urls_own_credentials_go_as_basic_auth(metrics_host):
    seen = metrics_host
    p = run_with(seen.host, metrics_userinfo="scraper:pa55@")
    assert p.returncode == 0, p.stderr
    basic = "Basic " + base64.b64encode(b"scraper:pa55").decode()
    assert seen.auth_on("/metrics") == {basic} and seen.auth_on("/dcgm") == {basic}
    assert "pa55" not in p.stdout + p.stderr


def test_an_unset_metrics_auth_variable_is_one_line():
    unset = {"RW_NOT_SET": ""}
    p = rw("run", "http://127.0.0.1:9", "--headless", "--metrics-auth-env", "RW_NOT_SET", env=unset, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "RW_NOT_SET" in p.stderr
