"""What the documentation says of the code is true of it: every schema number a page gives as current is the
code's, the report schema's history ends at the current one, docs/layout.md names exactly the modules on disk,
docs/ui.md's narrow-terminal columns are the report screen's, and docs/testing.md lists every test file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rampwatch.drivers.model.analysis import REPORT_SCHEMA
from rampwatch.drivers.model.events import SCHEMA as RECORDING_SCHEMA
from rampwatch.drivers.present.compare import COMPARE_SCHEMA
from rampwatch.drivers.run.sweep import SWEEP_SCHEMA
from rampwatch.tui.widgets.report import DROP_ORDER

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def text(page: str) -> str:
    return (DOCS / page).read_text(encoding="utf-8")


# (page, a pattern whose group is a schema number the page states as current, the code's number)
CURRENT_SCHEMAS = [
    ("measurement.md", r'\{"run": \{"schema": (\d+)', REPORT_SCHEMA),
    ("measurement.md", r"One JSON header line \(schema (\d+)", RECORDING_SCHEMA),
    ("replay.md", r"`json` \(schema (\d+)\) has `schema`, `baseline`", COMPARE_SCHEMA),
    ("replay.md", r"--format json +# schema (\d+)", COMPARE_SCHEMA),
    ("sweep.md", r"compare's schema (\d+)", COMPARE_SCHEMA),
    ("sweep.md", r"\(schema (\d+): `arrivals_per_min`", SWEEP_SCHEMA),
]


@pytest.mark.parametrize(("page", "pattern", "current"), CURRENT_SCHEMAS, ids=lambda x: str(x)[:30])
def test_every_current_schema_a_page_gives_is_the_codes(page, pattern, current):
    found = re.findall(pattern, text(page))
    assert found, f"{page}: no {pattern!r}"
    assert {int(n) for n in found} == {current}, (page, found, current)


def test_the_report_schemas_history_ends_at_the_current_one():
    added = [int(n) for n in re.findall(r"Schema (\d+) (?:added|split|gave)", text("measurement.md"))]
    assert added and max(added) == REPORT_SCHEMA, added


def layout_modules() -> dict[str, set[str]]:
    """docs/layout.md's package list: each package folder and the module names listed under it."""
    block = text("layout.md").split("## The packages", 1)[1].split("```", 2)[1]
    out: dict[str, set[str]] = {}
    package = None
    for line in block.splitlines():
        if m := re.match(r"^(\S+)/\s", line):
            package = m.group(1)
            out[package] = set()
        elif (m := re.match(r"^  (\w+)\s{2,}\S", line)) and package is not None:
            out[package].add(m.group(1))
    return out


def tree_modules() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for top in ("drivers", "tui"):
        for path in (ROOT / top).rglob("*.py"):
            if path.stem not in ("__init__", "__main__"):
                out.setdefault(str(path.parent.relative_to(ROOT)), set()).add(path.stem)
    return out


def test_layout_md_names_exactly_the_modules_on_disk():
    listed, tree = layout_modules(), tree_modules()
    assert set(listed) == set(tree), (sorted(set(tree) - set(listed)), sorted(set(listed) - set(tree)))
    for package, modules in tree.items():
        missing, stale = sorted(modules - listed[package]), sorted(listed[package] - modules)
        assert not missing and not stale, (package, missing, stale)


def test_ui_md_lists_the_report_screens_narrow_columns_in_their_order():
    m = re.search(r"columns are left out, in this order, until it fits: ([^;]+);", text("ui.md"))
    assert m is not None
    assert [c.strip() for c in m.group(1).split(",")] == list(DROP_ORDER)


def test_testing_md_lists_every_test_and_benchmark_file():
    listed = set(re.findall(r"`tests/((?:test|bench)_\w+\.py)`", text("testing.md")))
    files = {p.name for p in (ROOT / "tests").glob("*.py") if p.name.startswith(("test_", "bench_"))}
    assert files - listed == set(), sorted(files - listed)
    assert listed - files == set(), sorted(listed - files)
