"""The architecture holds: the contracts in pyproject.toml's [tool.importlinter] (layers that point down, what
present/ and sim/ may read, no Textual under drivers/, the UI below the command line, no import cycles), checked
by import-linter over the real import graph (imports inside functions and under TYPE_CHECKING count); each
contract breaks when its rule is broken; every package is placed in them; and the driver process behind the UI,
started fresh, loads no UI library."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from importlinter.api import read_configuration
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract

ROOT = Path(__file__).resolve().parents[1]
CONFIG = read_configuration(str(ROOT / "pyproject.toml"))
CONTRACT_TYPES = {"layers": LayersContract, "forbidden": ForbiddenContract, "acyclic_siblings": AcyclicSiblingsContract}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    options = CONFIG["session_options"]
    return grimp.build_graph(*options["root_packages"], include_external_packages=True, cache_dir=None)


def broken(graph: grimp.ImportGraph) -> dict[str, str]:
    """Each broken contract's id, and what import-linter says of it."""
    out = {}
    for options in CONFIG["contracts_options"]:
        contract = CONTRACT_TYPES[options["type"]](
            name=options["name"], session_options=CONFIG["session_options"], contract_options=options
        )
        check = contract.check(copy.deepcopy(graph), verbose=False)
        if not check.kept:
            out[options["id"]] = str(check.metadata)
    return out


def test_every_contract_is_kept(graph):
    assert len(CONFIG["contracts_options"]) >= 6
    assert broken(graph) == {}


@pytest.mark.parametrize(
    ("importer", "imported", "contract"),
    [
        # upward, and sideways between client and telemetry
        ("rampwatch.drivers.model.state", "rampwatch.drivers.telemetry.metrics", "layers"),
        ("rampwatch.drivers.net.wire", "rampwatch.drivers.client.chat", "layers"),
        ("rampwatch.drivers.client.ramp", "rampwatch.drivers.run.config", "layers"),
        ("rampwatch.drivers.telemetry.gpu", "rampwatch.drivers.client.chat", "layers"),
        ("rampwatch.drivers.run.runner", "rampwatch.tui.fmt", "layers"),
        # present and the simulated engine read the model alone
        ("rampwatch.drivers.present.report", "rampwatch.drivers.run.recording", "present-reads-the-model"),
        ("rampwatch.drivers.sim.engine", "rampwatch.drivers.client.chat", "sim-is-its-own-server"),
        # nothing under drivers/ draws
        ("rampwatch.drivers.run.runner", "textual", "drivers-never-draw"),
        # the app and its widgets sit below the command line
        ("rampwatch.tui.widgets.focus", "rampwatch.tui.cli.main", "the-ui-below-the-command-line"),
        ("rampwatch.tui.app", "rampwatch.tui.cli.launch", "the-ui-below-the-command-line"),
        # a cycle: the one goodput.py and analysis.py had (through a TYPE_CHECKING import), and one in the UI
        ("rampwatch.drivers.model.goodput", "rampwatch.drivers.model.analysis", "no-cycles"),
        ("rampwatch.tui.web_server", "rampwatch.tui.cli.main", "no-cycles"),
    ],
)
def test_a_broken_rule_breaks_its_contract(graph, importer, imported, contract):
    mutated = copy.deepcopy(graph)
    if imported not in mutated.modules:
        mutated.add_module(imported, is_squashed=True)  # an external package the code never imports
    mutated.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    assert contract in broken(mutated)


def test_every_package_is_placed_in_the_contracts():
    """A new package under drivers/ or tui/ is placed (a layer, a forbidden source, a cycle check) before it lands."""
    named = set()
    for options in CONFIG["contracts_options"]:
        for key in ("layers", "source_modules", "ancestors"):
            for entry in options.get(key, []):
                named.update(m.strip() for m in str(entry).replace("|", ":").split(":"))
    packages = {
        "rampwatch." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("drivers", "tui")
        for p in (ROOT / top).rglob("__init__.py")
        if p.parent != ROOT / top
    }
    assert packages and packages <= named | {p for p in packages if any(p.startswith(n + ".") for n in named)}, sorted(
        packages - named
    )
    drivers = {p for p in packages if p.startswith("rampwatch.drivers.")}
    cycle_checked = {a for o in CONFIG["contracts_options"] if o["type"] == "acyclic_siblings" for a in o["ancestors"]}
    assert drivers <= cycle_checked, sorted(drivers - cycle_checked)


def test_the_driver_process_loads_no_ui_library():
    """The process that stamps tokens (`python -m rampwatch.drivers.run.child`, behind the UI) imports neither
    Textual nor Rich: not itself, and not through httpx's command line, which httpx loads when Rich is installed."""
    code = (
        "import sys, rampwatch.drivers.run.child; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'rich', 'click', 'pygments'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
