"""How the command line says no: one line on stderr and exit 2, never a traceback or a usage dump."""

from __future__ import annotations

import sys

from rampwatch.drivers.run.exitcodes import EXIT_BAD_INPUT


class BadArguments(Exception):
    """The parser did not take the command line; main() scrubs the line of credentials before printing it."""


def fail(message: str) -> int:
    print(f"rampwatch: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
