"""A killed pytest leaves no server behind: what the tests' fixtures start (tests/procs.py) gets SIGTERM from the
kernel when the pytest process that started it dies, SIGKILL included; under pytest-xdist the worker dies with the
controller, and its servers with it. Checked on a small pytest session in a subprocess whose session fixture
starts a simulated engine (`rampwatch sim`), as the suite's own fixtures do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests import procs
from tests.conftest import ROOT, answers

pytestmark = pytest.mark.serial  # how long a process takes to end is what it checks

UP_S = 60.0  # a loaded machine may take this long to start pytest, a worker and the server
GONE_S = 5.0  # the server (and the worker) are gone this long after pytest was killed

HOLDING = textwrap.dedent("""
    import os
    import socket
    import time

    import pytest

    from tests.conftest import sim_process


    @pytest.fixture(scope="session")
    def server():
        with sim_process("--profile", "tiny") as (proc, url):
            yield proc, url


    def test_holds_the_server_until_killed(server):
        proc, url = server
        with socket.create_connection(("127.0.0.1", int(os.environ["RW_TELL_PORT"]))) as tell:
            tell.sendall(f"{proc.pid} {os.getpid()} {url}\\n".encode())
        time.sleep(600)
""")


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["pytest", "pytest-xdist"])
def test_a_killed_pytest_takes_its_fixtures_server_along(tmp_path, workers):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the session's root: not this repository's settings
    (tmp_path / "test_holding.py").write_text(HOLDING)
    log = tmp_path / "pytest.log"
    # The suite's conftest as a plugin: its fixtures' helpers and hooks (an xdist worker dying with its controller).
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", *workers]
    left: list[psutil.Process] = []
    with socket.create_server(("127.0.0.1", 0)) as tell, open(log, "w") as out:
        tell.settimeout(UP_S)
        env = {**os.environ, "RW_TELL_PORT": str(tell.getsockname()[1])}
        inner = procs.Popen(
            [*argv, str(tmp_path / "test_holding.py")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            try:
                conn, _ = tell.accept()  # the test runs: its session fixture's server is up
            except TimeoutError:
                pytest.fail(f"the inner pytest never reached its test in {UP_S:.0f} s: {log.read_text()[-3000:]}")
            with conn:
                conn.settimeout(UP_S)
                server_pid, holder_pid, url = conn.makefile().readline().split()
            server, holder = psutil.Process(int(server_pid)), psutil.Process(int(holder_pid))
            left = [server] if workers == [] else [server, holder]  # under xdist the holder is the worker
            assert answers(url + "/health") and server.ppid() == holder.pid
            assert (holder.pid == inner.pid) == (workers == []), "xdist ran the test in the controller"
            inner.send_signal(signal.SIGKILL)
            inner.wait(timeout=10)
            _, alive = psutil.wait_procs(left, timeout=GONE_S)
            alive = [p for p in alive if _alive(p)]
            assert not alive, f"still running {GONE_S:.0f} s after pytest was killed: " + ", ".join(
                f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in alive
            )
            assert not answers(url + "/health")
        finally:  # after a failure: nothing left behind by this test itself
            inner.kill()
            inner.wait()
            for p in left:
                if _alive(p):
                    p.kill()


STUBBORN = (  # a server as vLLM is while it starts: deaf to SIGTERM, and with a child of its own that is too
    "import os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "code = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
    "child = subprocess.Popen([sys.executable, '-c', code])\n"
    "print(os.getpid(), child.pid, flush=True)\n"
    "time.sleep(600)\n"
)

STARTER = (  # a pytest stand-in: starts the server under the reaper as the vLLM fixtures do, then dies
    "import os, sys\n"
    "from tests import procs\n"
    "from tests.conftest import REAPED\n"
    "p = procs.Popen([*REAPED, sys.executable, '-c', sys.argv[1]], stdout=__import__('subprocess').PIPE, text=True)\n"
    "print(p.stdout.readline(), end='', flush=True)\n"
    "os._exit(0)\n"
)


def test_a_server_deaf_to_sigterm_ends_with_its_children_once_its_starter_dies():
    """tests/reaper.py, which the vLLM fixtures start servers under: the server ignores SIGTERM and has a child
    that does too (a vLLM server while it starts hung there, and its engine core outlived it). Once the process
    that started them dies, both are gone within the reaper's grace period."""
    from tests.reaper import GRACE_S

    starter = subprocess.run([sys.executable, "-c", STARTER, STUBBORN], cwd=ROOT, capture_output=True, text=True,
                             timeout=UP_S)  # fmt: skip
    pids = [int(x) for x in starter.stdout.split()]
    assert len(pids) == 2, starter.stderr
    gone = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=GRACE_S + GONE_S)[0]
    assert sorted(p.pid for p in gone) == sorted(pids)
