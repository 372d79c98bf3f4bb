"""No process rampwatch starts outlives it.

Two halves. A child that is rampwatch's own code calls die_with_parent() first
thing: Linux then sends it SIGTERM when its parent dies, however the parent
died (SIGKILL included), and the child ends as it does on SIGTERM (the driver
finishes its recording). The parent names itself in the child's environment
(child_env), so a child whose parent died before it asked sees that and ends,
and a rampwatch command a person started is left alone.

A parent calls stop_on_signals(): SIGTERM and SIGHUP then unwind it as Ctrl-C
does, so the `finally` blocks that stop its children run, and it exits 143 or
129; a second signal ends it at once. The children it adopt()s are also
stopped when it exits, in case it leaves by a path that stopped nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import IO, NoReturn

PARENT_PID_VAR = "RAMPWATCH_PARENT_PID"  # set by the parent in a child's environment: its own pid
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
END_WAIT_S = 3.0  # how long adopted children get to end on SIGTERM (the driver closes its file) before SIGKILL
WATCH_EVERY_S = 0.25  # where the kernel cannot signal a parent's death: how often the child looks

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # Ctrl-C (SIGINT) is Python's KeyboardInterrupt already


def stop_signals() -> tuple[int, ...]:
    """What an event loop turns into a clean stop: Ctrl-C, SIGTERM, and SIGHUP (a
    closed SSH session) unless it is ignored, as under nohup."""
    hangup = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGINT, signal.SIGTERM, *hangup)


class Stopped(SystemExit):
    """SIGTERM or SIGHUP arrived: the process unwinds, its children stopped on the
    way, and exits 128 + the signal, as a shell reports a process it ended."""

    def __init__(self, sig: int):
        super().__init__(128 + sig)
        self.signal = sig


# -- in the child ------------------------------------------------------------------


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) for a child that is to die with this process."""
    return {**(os.environ if env is None else env), PARENT_PID_VAR: str(os.getpid())}


def die_with_parent() -> None:
    """SIGTERM to this process when the rampwatch process that started it dies.

    Does nothing in a process started otherwise (no PARENT_PID_VAR): `rampwatch
    run` under nohup must outlive its shell. The variable is removed, so this
    process's own children name it only if it asks (child_env)."""
    named = os.environ.pop(PARENT_PID_VAR, None)
    if named is None or not named.isdigit():
        return
    parent = int(named)
    if not _kernel_signals_parent_death(signal.SIGTERM):
        _watch_parent(parent)
    # The kernel ties the signal to the parent alive now: one that died before we asked was never seen.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _kernel_signals_parent_death(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG): Linux only; False where it is not there."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# Public for processes that are not rampwatch's own code (the tests' servers): the same kernel signal, asked for in
# the child before it execs (PR_SET_PDEATHSIG survives exec; it fires when the thread that forked the child exits).
kernel_signals_parent_death = _kernel_signals_parent_death


def _watch_parent(parent: int) -> None:
    """Without prctl (macOS): a thread that sends the SIGTERM once this process has another parent."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_EVERY_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rampwatch-parent-watch", daemon=True).start()


# -- in the parent -----------------------------------------------------------------

_children: list[subprocess.Popen] = []
_heard: list[int] = []  # SIGTERM or SIGHUP, once one came: this process is ending


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise Stopped in this process's main thread.

    Only a signal nobody else handles is taken: an event loop's or Textual's
    handler stays, and so does nohup's ignored SIGHUP. Such a loop hands its
    signals back to the default when it closes: call this again after it. If
    one came while the loop held it (handle_stop_signals), Stopped is raised now."""
    if threading.current_thread() is not threading.main_thread():
        return
    if _heard:
        _unwind(_heard[0])
    for sig in ENDING_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_signal)


def handle_stop_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[int], None]) -> None:
    """On `loop`, the stop signals (stop_signals) call `stop(signal)`, for a clean
    end of what the loop runs; SIGTERM and SIGHUP are remembered, so the process
    still ends once the loop is done (stop_on_signals). One that came before, and
    whose Stopped was lost (raised inside a __del__, Python only prints it), stops now."""
    for sig in stop_signals():
        loop.add_signal_handler(sig, _on_loop_signal, sig, stop)
    if _heard:
        loop.call_soon(stop, _heard[0])


def _on_loop_signal(sig: int, stop: Callable[[int], None]) -> None:
    if sig in ENDING_SIGNALS and not _heard:
        _heard.append(sig)
    stop(sig)


def _on_signal(sig: int, frame: FrameType | None) -> None:
    if not _heard:
        _heard.append(sig)
    _unwind(sig)


def _unwind(sig: int) -> NoReturn:
    for other in ENDING_SIGNALS:  # a second signal ends this process at once (its children end with it)
        if signal.getsignal(other) is _on_signal:
            signal.signal(other, signal.SIG_DFL)
    raise Stopped(sig)


def rampwatch_child(module: str, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """`python -m module`, a rampwatch child over its stdin and stdout (the driver behind the UI, a driver worker):
    in a session of its own (terminal signals reach rampwatch, which decides), adopted, and told to die with this
    process however it ends."""
    return adopt(
        subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
            env=child_env(),
        )
    )


def adopt(proc: subprocess.Popen) -> subprocess.Popen:
    """Stop `proc` when this process exits, if nothing stopped it before."""
    _children[:] = [p for p in _children if p.returncode is None]
    _children.append(proc)
    return proc


def end_children(wait: float = END_WAIT_S) -> None:
    """End every adopted child still running (see end)."""
    alive = [p for p in _children if p.poll() is None]
    _children.clear()
    for p in alive:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + wait
    for p in alive:
        end(p, max(0.0, deadline - time.monotonic()))


def end(proc: subprocess.Popen, wait: float = END_WAIT_S) -> int:
    """SIGTERM to `proc`, SIGKILL if it is still there `wait` seconds later; its exit code.
    A child started in a session of its own (start_new_session) is signalled with
    its whole process group: the web server with the pages it started."""
    _signal(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        return proc.wait()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.returncode is not None:
        return  # reaped: its pid may be another process's by now
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


atexit.register(end_children)
