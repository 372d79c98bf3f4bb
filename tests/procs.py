"""Subprocesses that die with the test run: `Popen` and `run` as subprocess's, whose child the kernel signals when
the pytest process that started it dies, however it dies (SIGKILL included), so no server, browser or run a test
started outlives a killed pytest. The mechanism is rampwatch's own for its children (drivers/run/lifetime.py):
prctl(PR_SET_PDEATHSIG), asked for in the child between fork and exec (it survives the exec).

The kernel sends that signal when the *thread* that forked the child exits, not the process: a child started from a
short-lived thread would be signalled when that thread ends. So only the main thread, which lives as long as the
process, may start one (pytest runs fixtures and tests there, async ones included); another thread gets an error.

The signal reaches that child only: a server whose own children outlive it (vLLM's engine core), or that hangs
on SIGTERM (vLLM while it starts), runs under tests/reaper.py, which ends its whole process group.

Linux only: elsewhere prctl is missing and a child of a killed pytest lives on (as before)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from rampwatch.drivers.run import lifetime

# SIGTERM, as rampwatch's own children get: a server ends as it does when stopped (vLLM takes its engine-core and
# worker processes along, rampwatch its children) rather than leaving its own children behind.
DEATH_SIGNAL = signal.SIGTERM


def dies_with_this_process(then: Callable[[], None] | None = None, sig: int = DEATH_SIGNAL) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when this process dies; `then` (another preexec_fn) runs after."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "a test's subprocess must be started from the main thread: its parent-death signal fires when the "
            "thread that started it ends"
        )
    parent = os.getpid()

    def preexec() -> None:
        lifetime.kernel_signals_parent_death(sig)
        if os.getppid() != parent:  # the parent died between the fork and the prctl: the kernel will not say so
            os.kill(os.getpid(), sig)
        if then is not None:
            then()

    return preexec


def Popen(args: Any, **kwargs: Any) -> subprocess.Popen:  # noqa: N802  (subprocess's name)
    """subprocess.Popen, the child dying with this process (a `preexec_fn` given runs after that is set up)."""
    return subprocess.Popen(args, preexec_fn=dies_with_this_process(kwargs.pop("preexec_fn", None)), **kwargs)


def run(args: Any, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run, the child dying with this process."""
    return subprocess.run(args, preexec_fn=dies_with_this_process(kwargs.pop("preexec_fn", None)), **kwargs)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process (an xdist worker) gets `sig` when its parent (the xdist controller) dies: the worker then dies
    at once, and the kernel signals the worker's own children (the servers its fixtures started) in turn."""
    parent = os.getppid()
    lifetime.kernel_signals_parent_death(sig)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
