"""One browser page's app process under --web: `python -m rampwatch.tui.cli.page ARGS` runs `rampwatch ARGS`
(a replay of the run's recording), ending with the web server that started it (tui/web_server.py)."""

from __future__ import annotations

import sys

from rampwatch.drivers.run import lifetime
from rampwatch.tui.cli.main import main

if __name__ == "__main__":
    lifetime.die_with_parent()
    sys.exit(main(sys.argv[1:]))
