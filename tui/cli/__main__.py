"""`python -m rampwatch.tui.cli`: the console script, for a checkout without it installed (the --web pages use it)."""

from __future__ import annotations

import sys

from rampwatch.tui.cli.main import main

sys.exit(main())
