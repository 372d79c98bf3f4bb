"""Imports point down: the model at the bottom, the network (net) on it, client and telemetry on those, run
above those, present beside them on the model, the simulated engine on the model alone, and the UI (tui/) on
top of everything.

Every module under drivers/ and tui/ is parsed (imports inside functions count too) and each import of
rampwatch is checked against its layer's row of ALLOWED; a module in a package with no row is reported too,
so a new package has to be placed before it can land.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = "rampwatch.drivers"
TUI = "rampwatch.tui"

# Each drivers/ package, and the drivers/ packages it may import (the root package itself, which holds
# only the version, is open to all).
ALLOWED: dict[str, set[str]] = {
    "model": {"model"},
    "net": {"model", "net"},
    "client": {"model", "net", "client"},
    "telemetry": {"model", "net", "telemetry"},
    "run": {"model", "net", "client", "telemetry", "run"},
    "present": {"model", "present"},
    "sim": {"model", "sim"},
}
UI_ONLY = ("textual", TUI)  # nothing under drivers/ may import these


def module_name(path: Path) -> str:
    """drivers/model/state.py -> rampwatch.drivers.model.state; a package's __init__ names the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["rampwatch", *parts])


def imported_names(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, anywhere in it, relative ones resolved; `from pkg import x`
    gives pkg.x where pkg is a bare namespace (rampwatch, rampwatch.drivers), so its layer is x's."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base in ("rampwatch", DRIVERS):
                out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, base))
    return out


def _layer(name: str) -> str | None:
    """The drivers/ package a rampwatch.drivers module belongs to; None for the root package (and the
    root's own names, such as its __version__)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and not parts[2].startswith("__") else None


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Each import in `module` that points up (or sideways into a layer its row does not allow)."""
    if _within(module, TUI):
        return []  # the UI sits on top: it may import anything
    if not _within(module, DRIVERS):
        return [f"{module}: not under drivers/ or tui/, so no layer"]
    own = _layer(module)
    if own is not None and own not in ALLOWED:
        return [f"{module}: package {own!r} has no row in ALLOWED (place it in the layers first)"]
    allowed = ALLOWED.get(own, set()) if own is not None else set()
    bad = []
    for line, name in imported_names(module, source, is_package):
        if any(_within(name, ui) for ui in UI_ONLY):
            bad.append(f"{module}:{line} imports {name} (the UI's; drivers/ never imports it)")
        elif _within(name, DRIVERS):
            target = _layer(name)
            if target is not None and target not in allowed:
                bad.append(f"{module}:{line} imports {name} ({own or 'drivers'} may import only {sorted(allowed)})")
        elif _within(name, "rampwatch") and name != "rampwatch":
            bad.append(f"{module}:{line} imports {name}, outside drivers/")
    return bad


def _modules() -> list[Path]:
    return sorted(p for top in ("drivers", "tui") for p in (ROOT / top).rglob("*.py"))


def test_every_import_points_down():
    paths = _modules()
    assert any(p.parent.name == "model" for p in paths) and any(p.parent.name == "widgets" for p in paths)
    bad = [v for p in paths for v in layer_violations(module_name(p), p.read_text(), p.name == "__init__.py")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("module", "source", "reported"),
    [
        # upward imports, at the top and inside a function
        ("rampwatch.drivers.model.state", "from rampwatch.drivers.telemetry.metrics import ENGINE_POOL\n", "telemetry"),
        ("rampwatch.drivers.model.turns", "def f():\n    from rampwatch.drivers.present import format\n", "present"),
        ("rampwatch.drivers.model.turns", "import rampwatch.drivers.run.runner\n", "run"),
        ("rampwatch.drivers.client.ramp", "from rampwatch.drivers.run.config import BadInput\n", "run"),
        ("rampwatch.drivers.telemetry.gpu", "from rampwatch.drivers.client import chat\n", "client"),
        ("rampwatch.drivers.present.report", "from rampwatch.drivers.run.recording import Recording\n", "run"),
        ("rampwatch.drivers.sim.engine", "from rampwatch.drivers.client.chat import chat_body\n", "client"),
        ("rampwatch.drivers.sim.engine", "from rampwatch.drivers import telemetry\n", "telemetry"),
        ("rampwatch.drivers.model.state", "from ..present.report import render\n", "present"),
        # the UI's imports
        ("rampwatch.drivers.run.runner", "import textual.app\n", "textual"),
        ("rampwatch.drivers.present.report", "def f():\n    from rampwatch.tui.fmt import pct\n", "rampwatch.tui"),
        ("rampwatch.drivers.run.headless", "from rampwatch.tui import fmt\n", "rampwatch.tui"),
        # a package nobody has placed
        ("rampwatch.drivers.newthing.x", "import os\n", "no row"),
    ],
)
def test_an_upward_import_is_reported(module, source, reported):
    bad = layer_violations(module, source)
    assert len(bad) == 1 and reported in bad[0], bad


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("rampwatch.drivers.model.state", "from rampwatch.drivers.model import events as ev\nfrom . import turns\n"),
        ("rampwatch.drivers.telemetry.metrics", "from rampwatch.drivers.model.endpoints import ENGINE_POOL\n"),
        (
            "rampwatch.drivers.run.runner",
            "import rampwatch.drivers as drivers\nfrom rampwatch.drivers.client import chat\n"
            "from rampwatch.drivers.telemetry.gpu import GpuSampler\n",
        ),
        ("rampwatch.drivers.present.report", "from rampwatch.drivers.model.analysis import Report\n"),
        ("rampwatch.drivers.sim.server", "import rampwatch.drivers as drivers\nfrom .engine import SimEngine\n"),
        ("rampwatch.tui.cli.report", "from rampwatch.drivers.present.report import render\nimport textual\n"),
    ],
)
def test_a_downward_import_passes(module, source):
    assert layer_violations(module, source) == []
