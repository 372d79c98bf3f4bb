"""The `rampwatch` command line: the argument spec (spec/, one module per command family), one small module
per command, and main().

Only main is imported here: each command's module (and what it needs: the UI, the simulator, the run
machinery) is imported when that command runs.
"""

from __future__ import annotations

from rampwatch.tui.cli.main import main

__all__ = ["main"]
