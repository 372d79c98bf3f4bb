"""The parser every command uses: bad arguments are one line (exit 2), and a command's flags are added only when
that command is parsed or its help shown."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rampwatch.tui.cli.errors import BadArguments


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments raise BadArguments (one line, exit 2 in main), not a usage dump; a command's
    flags are added by `populate` the first time the command is parsed or its help is shown."""

    def __init__(self, *args: Any, populate: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any):
        # No abbreviated flags: a value is scrubbed from the recorded command by its flag's full name.
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self._populate = populate

    def populated(self) -> OneLineParser:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        return super(OneLineParser, self.populated()).parse_known_args(args, namespace)

    def format_help(self) -> str:
        return super(OneLineParser, self.populated()).format_help()

    def format_usage(self) -> str:
        return super(OneLineParser, self.populated()).format_usage()

    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadArguments(f"{self.prog}: {message} (see {self.prog} --help)")
