"""The driver's exit codes, in one small module so the process supervisor and the command line can name them
without importing the whole runner. The others are the shell's own: 0 done, 1 a turn failed, 130/143 interrupted
by SIGINT/SIGTERM."""

from __future__ import annotations

import signal

EXIT_BAD_INPUT = 2  # a flag, file or server answer that cannot be used: one clear line, no traceback
EXIT_CRASHED = 3  # an unexpected exception in the driver (recorded as a crashed run)


def exit_reason(code: int | None) -> str:
    """How a child process ended, in words: `killed by SIGKILL`, `exited with code 3` (None: `did not exit`)."""
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def crash_summary(e: BaseException) -> str:
    """An exception in one line: its type and message."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__
