"""Nothing rampwatch starts outlives it: the simulated engines, the driver
process, the web server and each browser page's process end within seconds of
the rampwatch command that started them, whether that command got SIGTERM,
SIGHUP (an SSH session closing) or SIGKILL."""

from __future__ import annotations

import fcntl
import functools
import os
import pty
import signal
import socket
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run import lifetime
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
from tests.conftest import Lines, answers, assert_port_free, free_port, free_ports, rampwatch_cmd
from tests.simhost import ThreadedSim

pytestmark = pytest.mark.serial  # how soon every process has ended (GONE_S) is what it checks

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "recordings" / "glm-like-2x1m.sample.jsonl"
UP_S = 40.0  # a loaded machine may take this long to start a command and its children
GONE_S = 3.0  # every process a command started has ended this long after the command did
# The simulated demo at real speed: turns of seconds, so a signal lands mid-run.
SLOW_DEMO = ["--time-scale", "1", "--schedule", "2k,4k,8k,16k,32k,64k,128k"]
SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]


def default_hangup() -> None:
    """In the command's process: SIGHUP as a login shell leaves it (a test run under nohup ignores it, and the
    command would inherit that: nohup's rampwatch rightly outlives a closed session)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Launched:
    """A rampwatch command in a session of its own, its output in a file (or a pseudo-terminal)."""

    def __init__(self, argv: list[str], log: Path, terminal: bool = False):
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}  # a hang shows where (end_with)
        # In a session of its own, whichever way its output goes; env is read at the start (the pty's settings count).
        launch = functools.partial(
            procs.Popen, argv, env=env, cwd=ROOT, start_new_session=True, preexec_fn=default_hangup
        )
        if terminal:
            try:
                master, slave = pty.openpty()
            except OSError as e:
                pytest.skip(f"the UI needs a terminal and no pseudo-terminal can be had here: {e}")
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
            env.update(TERM="xterm-256color", COLUMNS="140", LINES="40")
            self.proc = launch(stdin=slave, stdout=slave, stderr=slave)
            os.close(slave)
            threading.Thread(target=self._drain, args=(master,), daemon=True).start()  # a full terminal would block it
        else:
            with open(log, "wb") as out:
                self.proc = launch(stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.root = psutil.Process(self.proc.pid)

    def _drain(self, fd: int) -> None:
        with open(self.log, "wb") as out:
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                out.write(data)
        os.close(fd)

    def descendants(self) -> list[psutil.Process]:
        try:
            return self.root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def wait_for(self, count: int, what: str) -> list[psutil.Process]:
        """Its descendants, once there are `count` of them."""
        deadline = time.monotonic() + UP_S
        while len(found := self.descendants()) < count:
            if self.proc.poll() is not None:
                pytest.fail(f"rampwatch exited {self.proc.returncode} before {what} was up: {self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{what} not up in {UP_S:.0f} s ({len(found)} of {count} processes): {self.output()}")
            time.sleep(0.05)
        return found

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""

    def end_with(self, sig: int) -> int:
        """Send `sig`; its exit code, after asserting that every process it had started is gone."""
        started = self.descendants()
        assert started, "no child processes to watch"
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # its threads' stacks into the output (PYTHONFAULTHANDLER)
            time.sleep(2)
            self.proc.kill()
            pytest.fail(f"rampwatch did not end within 20 s of {sig.name}: {self.output()}")
        _, alive = psutil.wait_procs(started, timeout=GONE_S)
        alive = [p for p in alive if _running(p)]
        for p in alive:
            p.kill()
        assert not alive, f"{sig.name}: still running {GONE_S:.0f} s after rampwatch ended: " + ", ".join(
            f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in alive
        )
        return code

    def close(self) -> None:
        """After a failed test: nothing left behind by the test itself."""
        for p in [*self.descendants(), self.root]:
            if _running(p):
                p.kill()
        self.proc.wait()


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def exit_code_for(sig: int) -> int:
    """What a command that handled `sig` exits with; a killed one reports -SIGKILL."""
    return -sig if sig == signal.SIGKILL else 128 + sig


def open_page(port: int) -> socket.socket:
    """What a browser tab does: open the UI's websocket, so textual-serve starts a page's process. Held open."""
    deadline = time.monotonic() + UP_S
    while not answers(f"http://127.0.0.1:{port}/"):
        if time.monotonic() > deadline:
            pytest.fail(f"the web UI on port {port} did not answer")
        time.sleep(0.1)
    ws = socket.create_connection(("127.0.0.1", port), timeout=10)
    ws.sendall(
        f"GET /ws?width=100&height=30 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert ws.recv(64).startswith(b"HTTP/1.1 101"), "the websocket was refused"
    return ws


def end_with_a_page_open(cmd: Launched, port: int, sig: int, processes: int) -> None:
    """Open a page (textual-serve starts its process), wait until `cmd` has `processes` descendants, and
    end `cmd` with `sig` while the page is open: it exits as it should for that signal."""
    with open_page(port):
        cmd.wait_for(processes, "a page's process")
        assert cmd.end_with(sig) == exit_code_for(sig), cmd.output()


def assert_recording_closed(path: Path, sig: int) -> None:
    """The driver that recorded `path` ended on SIGTERM (directly, or from the kernel when its parent died) and
    closed the file: the run's last event is its end."""
    deadline = time.monotonic() + 5  # the driver may outlive its parent by the time it takes to close the file
    while True:
        last = read_recording(path).events[-1]
        if isinstance(last, ev.RunEnded) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert isinstance(last, ev.RunEnded) and last.status == "interrupted", f"{sig.name}: the recording ends with {last}"


def wait_for_first_request(rec: Path) -> None:
    """Until the run has sent its first request: a signal then lands mid-run, with the recording open."""
    deadline = time.monotonic() + UP_S
    while not (rec.exists() and b'"RequestSent"' in rec.read_bytes()):
        if time.monotonic() > deadline:
            pytest.fail("the run never sent a request")
        time.sleep(0.05)


@pytest.fixture
def launched():
    started: list[Launched] = []
    yield started
    for cmd in started:
        cmd.close()


# -- each command ------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_demo_headless_takes_its_engine_along(tmp_path, launched, sig):
    rec = tmp_path / "run.jsonl"
    cmd = Launched([*rampwatch_cmd(), "demo", "--headless", "--record", str(rec), *SLOW_DEMO], tmp_path / "out")
    launched.append(cmd)
    cmd.wait_for(1, "the simulated engine")
    wait_for_first_request(rec)
    assert cmd.end_with(sig) == exit_code_for(sig), cmd.output()
    if sig != signal.SIGKILL:  # the run is in this process: killed, it closes nothing
        last = read_recording(rec).events[-1]
        assert isinstance(last, ev.RunEnded) and last.exit_code == 128 + sig


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_demo_ui_takes_its_driver_and_engine_along(tmp_path, launched, sig):
    rec = tmp_path / "run.jsonl"
    cmd = Launched([*rampwatch_cmd(), "demo", "--record", str(rec), *SLOW_DEMO], tmp_path / "out", terminal=True)
    launched.append(cmd)
    cmd.wait_for(2, "the simulated engine and the driver")
    wait_for_first_request(rec)
    assert cmd.end_with(sig) == exit_code_for(sig), cmd.output()
    assert_recording_closed(rec, sig)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("ui", [False, True], ids=["headless", "ui"])
def test_demo_with_workers_takes_its_workers_along(tmp_path, launched, sig, ui):
    """--workers 2: the engine, (with the UI) the driver, and its two worker processes end with the command."""
    rec = tmp_path / "run.jsonl"
    argv = [*rampwatch_cmd(), "demo", "--workers", "2", "--record", str(rec), *SLOW_DEMO]
    cmd = Launched(argv + (["--headless"] if not ui else []), tmp_path / "out", terminal=ui)
    launched.append(cmd)
    cmd.wait_for(4 if ui else 3, "the simulated engine, the driver and its workers")
    wait_for_first_request(rec)
    assert cmd.end_with(sig) == exit_code_for(sig), cmd.output()
    if ui:
        assert_recording_closed(rec, sig)
    elif sig != signal.SIGKILL:
        last = read_recording(rec).events[-1]
        assert isinstance(last, ev.RunEnded) and last.exit_code == 128 + sig


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_demo_web_takes_its_engine_web_server_and_pages_along(tmp_path, launched, sig):
    port = free_port()
    rec = tmp_path / "run.jsonl"
    cmd = Launched(
        [*rampwatch_cmd(), "demo", "--web", f"127.0.0.1:{port}", "--record", str(rec), *SLOW_DEMO], tmp_path / "out"
    )
    launched.append(cmd)
    cmd.wait_for(2, "the simulated engine and the web server")
    wait_for_first_request(rec)
    end_with_a_page_open(cmd, port, sig, processes=3)
    assert_port_free(port)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_replay_web_takes_its_web_server_and_pages_along(tmp_path, launched, sig):
    port = free_port()
    cmd = Launched([*rampwatch_cmd(), "replay", str(SAMPLE), "--web", f"127.0.0.1:{port}"], tmp_path / "out")
    launched.append(cmd)
    cmd.wait_for(1, "the web server")
    end_with_a_page_open(cmd, port, sig, processes=2)
    assert_port_free(port)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_run_web_takes_its_web_server_and_pages_along(tmp_path, launched, sig):
    port = free_port()
    rec = tmp_path / "run.jsonl"
    with ThreadedSim(make_profile("tiny", time_scale=0.05)) as sim:
        cmd = Launched(
            [
                *rampwatch_cmd(),
                "run",
                sim.url,
                "--schedule",
                "2k,4k,8k,16k",
                "--gpu",
                "none",
                "--web",
                f"127.0.0.1:{port}",
                "--record",
                str(rec),
            ],
            tmp_path / "out",
        )
        launched.append(cmd)
        cmd.wait_for(1, "the web server")
        end_with_a_page_open(cmd, port, sig, processes=2)
    assert_port_free(port)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("topology", [["--replicas", "2"], ["--pd"]], ids=["replicas", "pd"])
def test_sim_ends_and_frees_its_ports(tmp_path, launched, topology, sig):
    """`rampwatch sim` serves every engine of a topology in its own process: ended, it leaves no port taken."""
    count = 3 if topology == ["--pd"] else 2
    first = free_ports(count)
    cmd = Launched([*rampwatch_cmd(), "sim", "--port", str(first), *topology], tmp_path / "out")
    launched.append(cmd)
    deadline = time.monotonic() + UP_S
    for port in range(first, first + count):
        while not answers(f"http://127.0.0.1:{port}/health"):
            if time.monotonic() > deadline or cmd.proc.poll() is not None:
                pytest.fail(f"rampwatch sim did not serve port {port}: {cmd.output()}")
            time.sleep(0.1)
    assert cmd.descendants() == []  # the engines are in-process: nothing else to end
    cmd.proc.send_signal(sig)
    cmd.proc.wait(timeout=20)
    for port in range(first, first + count):
        assert_port_free(port)


# -- the pieces --------------------------------------------------------------------

# A parent (this snippet) starts a child that asks to die with it, prints the child's pid, then waits to be killed.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from rampwatch.drivers.run import lifetime
    child = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], env=lifetime.child_env())
    print(child.pid, flush=True)
    time.sleep(60)
""")
CHILD = textwrap.dedent("""
    import os, sys, time
    from rampwatch.drivers.run import lifetime
    if sys.argv[1:] == ["no-prctl"]:
        lifetime._kernel_signals_parent_death = lambda sig: False
    lifetime.die_with_parent()
    print("asked", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("how", ["prctl", "no-prctl"])
def test_a_child_dies_with_its_killed_parent(how):
    """prctl(PR_SET_PDEATHSIG) on Linux; elsewhere a thread that sees the parent change."""
    parent = procs.Popen([sys.executable, "-c", PARENT, CHILD, how], stdout=subprocess.PIPE, text=True)
    try:
        out = Lines(parent.stdout)  # the parent's, and the child's (it inherits it)
        child = psutil.Process(int(out.wait_for(r"^\d+$", UP_S)))
        assert out.wait_for("^asked$", UP_S), "the child never asked to die with its parent"
        assert _running(child)
        parent.kill()
        parent.wait()
        _, alive = psutil.wait_procs([child], timeout=GONE_S)
        assert not [p for p in alive if _running(p)], f"the child outlived its killed parent ({how})"
    finally:
        parent.kill()
        parent.wait()


def test_a_child_whose_parent_already_died_ends_at_once():
    """The kernel signals the death of the parent alive when the child asked: one already gone is checked for."""
    env = {**os.environ, lifetime.PARENT_PID_VAR: "1"}  # not this child's parent: as if it had died and left it
    code = "from rampwatch.drivers.run import lifetime; lifetime.die_with_parent(); import time; time.sleep(30)"
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=20)
    assert done.returncode == -signal.SIGTERM


def test_a_command_a_person_started_does_not_die_with_its_shell():
    """No parent named in the environment: die_with_parent leaves the process alone (nohup rampwatch ...)."""
    env = {k: v for k, v in os.environ.items() if k != lifetime.PARENT_PID_VAR}
    code = (
        "import ctypes, os; from rampwatch.drivers.run import lifetime; lifetime.die_with_parent(); "
        "sig = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0); print(sig.value)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=20)
    assert done.stdout.strip() == "0", done.stderr  # PR_GET_PDEATHSIG: none asked for


def test_nohup_keeps_sighup_ignored():
    code = textwrap.dedent("""
        import signal
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        from rampwatch.drivers.run import lifetime
        lifetime.stop_on_signals()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.SIGHUP not in lifetime.stop_signals()
        assert signal.getsignal(signal.SIGTERM) is lifetime._on_signal
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr


def test_sigterm_unwinds_like_ctrl_c_and_a_second_one_ends_at_once():
    """The first SIGTERM raises Stopped (finally blocks run: children stopped), exit 143; a second during that
    clean-up is not caught again: it ends the process."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        from rampwatch.drivers.run import lifetime
        lifetime.stop_on_signals()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            print("clean-up ran", flush=True)
            if sys.argv[1] == "twice":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
                print("not reached", flush=True)
    """)
    once = subprocess.run([sys.executable, "-c", code, "once"], capture_output=True, text=True, timeout=20)
    assert (once.returncode, once.stdout) == (143, "clean-up ran\n"), once.stderr
    twice = subprocess.run([sys.executable, "-c", code, "twice"], capture_output=True, text=True, timeout=20)
    assert (twice.returncode, twice.stdout) == (-signal.SIGTERM, "clean-up ran\n"), twice.stderr
