"""The documentation holds together: every relative link in README.md and docs/*.md lands on a file (and heading)
inside the repository, the README stays a short front page, and every command and flag is explained somewhere."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from rampwatch.tui.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
# docs/cli.md is generated from the argument parser; the hand-written pages must explain every flag without it.
GUIDES = [README] + [p for p in PAGES if p.name != "cli.md"]
README_MAX_LINES = 220
COMMANDS = ("run", "watch", "replay", "report", "demo", "sim", "compare", "sweep", "export", "trace")
# Commands with subcommands of their own, whose flags --help shows one word further down.
SUBCOMMANDS = ("trace info", "trace export")
# The two commands on a fresh machine; .ci/run and the people who copy them rely on these exact lines.
FRESH_MACHINE_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/rampwatch demo",
    "bash .ci/run",
)

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(markdown: str) -> str:
    """The text outside code: links inside fenced blocks or code spans are examples, not links."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))}


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Every relative link on the page that leaves the repository, names no file, or names a missing heading."""
    problems = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page.resolve()
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{page.name}: {target} leaves the repository")
        elif not dest.is_file():
            problems.append(f"{page.name}: {target} names no file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.name}: {target} names no heading of {dest.name}")
    return problems


@pytest.mark.parametrize("page", [README] + PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_checker_reports_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# A heading\n", encoding="utf-8")
    (tmp_path / "outside.md").write_text("x\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[fine](there.md#a-heading) [gone](missing.md) [no heading](there.md#nothing) [out](../../outside.md)\n"
        "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n[web](https://example.com/x.md)\n",
        encoding="utf-8",
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md: missing.md names no file",
        "page.md: there.md#nothing names no heading of there.md",
        "page.md: ../../outside.md leaves the repository",
    ]


def test_slug_matches_githubs_anchors() -> None:
    assert slug("In a browser: `--web [HOST:]PORT`") == "in-a-browser---web-hostport"
    assert slug("`rampwatch report PATH` — per-turn tables") == "rampwatch-report-path--per-turn-tables"


def test_readme_is_a_short_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_sends_nobody_outside_the_repository() -> None:
    text = README.read_text(encoding="utf-8")
    assert "../" not in text, "README.md is at the repository's root: a ../ path leaves it"


def test_readme_keeps_the_two_commands_on_a_fresh_machine() -> None:
    lines = {line.strip() for line in README.read_text(encoding="utf-8").splitlines()}
    for command in FRESH_MACHINE_COMMANDS:
        assert command in lines


def help_text(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return out.getvalue()


def test_the_readme_table_names_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = re.findall(r"^ {4}(\w+) ", help_text([], monkeypatch), re.M)
    assert sorted(listed) == sorted(COMMANDS)
    rows = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("| `rampwatch ")]
    assert sorted(row.split()[2].strip("`") for row in rows) == sorted(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS + SUBCOMMANDS)
def test_every_flag_is_explained_in_a_guide(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text(command.split(), monkeypatch))) - {"--help"}
    guides = "\n".join(p.read_text(encoding="utf-8") for p in GUIDES)
    missing = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![a-z0-9-])", guides))
    assert missing == [], f"rampwatch {command}: flags no page in docs/ explains"
