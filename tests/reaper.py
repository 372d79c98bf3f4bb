"""Runs a server (its argv after this script's) in a process group of its own, and ends that whole group when told
to stop or when its own parent dies (tests/procs.py has the kernel say so): SIGTERM, then SIGKILL GRACE_S later.

Why a group, and why here: a vLLM server that takes SIGTERM while it starts hangs there, and its engine-core and
worker processes outlive a SIGKILLed API server. Ending only the process the test started left them running for
hours after a killed test run; ending its group, sure of it, leaves nothing. Standard library only: it runs from
any working directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

GRACE_S = 20.0  # how long the server may take to stop on SIGTERM (vLLM: a few seconds) before the group is killed
POLL_S = 0.1


def end_group(child: subprocess.Popen) -> None:
    """SIGTERM to the child's group, then SIGKILL to whatever of it is left once the child ended or GRACE_S went."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def main() -> int:
    child = subprocess.Popen(sys.argv[1:], start_new_session=True)

    def stop(signum: int, _frame: object) -> None:
        end_group(child)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    while (code := child.poll()) is None:  # polled, not waited: a handler may poll it meanwhile
        time.sleep(POLL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # what it left behind, if anything
    return code


if __name__ == "__main__":
    sys.exit(main())
