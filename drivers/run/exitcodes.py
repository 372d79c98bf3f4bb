"""The driver's exit codes, in one small module so the process supervisor and the command line can name them
without importing the whole runner. The others are the shell's own: 0 done, 1 a turn failed, 130/143 interrupted
by SIGINT/SIGTERM."""

from __future__ import annotations

EXIT_BAD_INPUT = 2  # a flag, file or server answer that cannot be used: one clear line, no traceback
EXIT_CRASHED = 3  # an unexpected exception in the driver (recorded as a crashed run)
