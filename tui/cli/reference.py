"""The command-line reference, generated from the argument spec so it cannot drift from it:
`python -m rampwatch.tui.cli.reference > docs/cli.md` (a test fails when docs/cli.md is stale)."""

from __future__ import annotations

import argparse
import sys

from rampwatch.tui.cli.spec import build_parser
from rampwatch.tui.cli.spec.parser import OneLineParser

REGENERATE = "python -m rampwatch.tui.cli.reference > docs/cli.md"


def reference() -> str:
    """docs/cli.md: every command, every flag with its help, default and choices."""
    parser = build_parser()
    commands = subcommands(parser)
    out = [
        "# The rampwatch command line",
        "",
        f"Generated from the argument parser (`{REGENERATE}`); edit the help texts in tui/cli/spec/, not this page.",
        "",
        "```",
        "rampwatch [--version] COMMAND [ARGS]",
        "```",
        "",
        "Exit codes: 0 done, 1 done with failed turns, 2 bad input, 3 crashed (the driver died or raised), "
        "129/130/143 interrupted (SIGHUP, Ctrl-C, SIGTERM).",
        "",
        "| Command | What it does |",
        "|---|---|",
    ]
    out += [f"| [`{name}`](#rampwatch-{name.replace(' ', '-')}) | {help_text} |" for name, help_text, _ in commands]
    for name, help_text, sub in commands:
        out += ["", f"## rampwatch {name}", "", help_text[:1].upper() + help_text[1:] + "."]
        for group in sub._action_groups:
            actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
            if actions:
                out += ["", f"### {group.title[:1].upper() + group.title[1:]}", ""]
                out += [flag_line(sub, a) for a in actions]
    return "\n".join(out) + "\n"


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, OneLineParser]]:
    """(name, help, parser with its flags) for each command, in the order --help lists them; a command with
    subcommands of its own (`trace info`) is followed by each of them, named with both words."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in action._choices_actions}
    out = []
    for name, sub in action.choices.items():
        populated = sub.populated()  # type: ignore[attr-defined]
        out.append((name, helps[name], populated))
        if any(isinstance(a, argparse._SubParsersAction) for a in populated._actions):
            out += [(f"{name} {inner}", text, p) for inner, text, p in subcommands(populated)]
    return out


def flag_line(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """One bullet: how it is written, its help, then its choices and its default (unless the help says it)."""
    extras = []
    if action.choices is not None:
        extras.append("choices: " + ", ".join(f"`{c}`" for c in action.choices))
    default = parser.get_default(action.dest)
    if "default" not in (action.help or "").lower() and action.option_strings:
        if isinstance(action, argparse.BooleanOptionalAction):
            extras.append(f"default: {'on' if default else 'off'}")
        elif default not in (None, False, [], argparse.SUPPRESS):
            extras.append(f"default: `{default}`")
    return f"- `{spelling(action)}`: {action.help}" + (f" ({'; '.join(extras)})" if extras else "")


def spelling(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest
        return {"+": f"{name} [{name} ...]", "*": f"[{name} ...]", "?": f"[{name}]"}.get(str(action.nargs), str(name))
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or (
        ("{" + ",".join(map(str, action.choices)) + "}") if action.choices else action.dest.upper()
    )
    return ", ".join(f"{flag} {metavar}" for flag in action.option_strings)


if __name__ == "__main__":
    sys.stdout.write(reference())
