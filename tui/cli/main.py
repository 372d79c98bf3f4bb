"""main(): parse, then hand the arguments to the command's own module, imported only when it runs (so
`report` loads neither the UI, the simulator nor a web server).

Exit codes: 0 done, 1 done with failed turns, 2 bad input, 3 crashed (the
driver died or raised), 129/130/143 interrupted (SIGHUP, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import importlib
import sys

from rampwatch.drivers.client.ramp import ScheduleError
from rampwatch.drivers.run import lifetime
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.recording import RecordingError
from rampwatch.drivers.run.scrub import scrub_message
from rampwatch.tui.cli.errors import EXIT_BAD_INPUT, BadArguments, fail
from rampwatch.tui.cli.spec import build_parser

# Command -> the module under rampwatch.tui.cli whose execute(args, argv) runs it.
MODULES = {
    "run": "run",
    "watch": "run",
    "demo": "demo",
    "sim": "sim",
    "replay": "replay",
    "report": "report",
    "compare": "compare",
    "export": "export",
    "sweep": "sweep",
    "trace": "trace",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except BadArguments as e:  # argparse quotes what it did not take: never a key typed after a mistyped flag
        print(scrub_message(str(e), argv), file=sys.stderr)
        return EXIT_BAD_INPUT
    lifetime.stop_on_signals()  # SIGTERM and SIGHUP unwind like Ctrl-C: the children started below are stopped
    try:
        command = importlib.import_module(f"rampwatch.tui.cli.{MODULES[args.command]}")
        return command.execute(args, argv)
    except (BadInput, ScheduleError, RecordingError) as e:
        return fail(str(e))
    except KeyboardInterrupt:
        return 130
