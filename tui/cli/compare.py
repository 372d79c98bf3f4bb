"""`rampwatch compare`: recordings side by side, each labelled, ratios against a baseline run."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from rampwatch.drivers.model.analysis import Report, build_report
from rampwatch.drivers.present import picture
from rampwatch.drivers.present.compare import compare
from rampwatch.drivers.present.compare_table import COMPARE_COLUMNS, render_comparison
from rampwatch.drivers.run.sweep import read_sweep
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.files import fold, load_state, read_merged, write_file

# One compared run: label, path, report, engine version, the ramp's schedule.
Compared = tuple[str, str, Report, str, list[int]]
MERGED = " + "  # between the parts' paths of a run merged from its shards (--merge)


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    # The runs in their columns' order: the RUNs (a sweep file as its runs), then each --merge's shards as one run.
    sources: list[Path | list[Path]] = []
    for path in args.paths:
        sources += read_sweep(path) or [path]
    sources += args.merge
    if not sources:
        return fail("compare needs runs: recordings (RUN...) and/or --merge PART... (a run's shards)")
    if args.label and len(args.label) != len(sources):
        return fail(f"{len(args.label)} --label for {len(sources)} runs: give one per run, in order")
    runs = labelled(
        [load(src, args.label[k] if args.label else None, args.skip_bad_lines) for k, src in enumerate(sources)]
    )
    baseline = 0
    if args.baseline:
        found = baseline_index(runs, args.baseline)
        if found is None:
            return fail(f"--baseline {args.baseline}: not one of the runs compared")
        baseline = found
    cmp = compare(runs, baseline)
    # A terminal's width is fitted (columns left out in a known order, and said); a pipe or file gets them all.
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    sys.stdout.write(render_comparison(cmp, args.format, width))
    if args.html:
        fields = [(name, [cell(r) for r in cmp.runs]) for name, cell in COMPARE_COLUMNS]
        return write_file(args.html, picture.compare_html(cmp, fields))
    return 0


def load(source: Path | list[Path], label: str | None, skip_bad_lines: bool) -> Compared:
    """One run's row (a recording, or a run's shards merged, its path the parts' joined by +): its --label, else
    model@engine."""
    if isinstance(source, list):
        state, path = fold(read_merged(source, skip_bad_lines)), MERGED.join(map(str, source))
    else:
        state, path = load_state(source, skip_bad_lines), str(source)
    rep = build_report(state)
    h = state.header
    ramp = [s for s in state.sessions.values() if s.role == "ramp"]
    return (
        label or f"{rep.run.model or '?'}@{rep.run.engine or '?'}",
        path,
        rep,
        (h.engine_version or "") if h else "",
        ramp[0].schedule if ramp else [],
    )


def labelled(runs: list[Compared]) -> list[Compared]:
    """Default labels of same-model runs are the same: number them all so they can be told apart."""
    labels = [r[0] for r in runs]
    if len(set(labels)) < len(labels):
        return [(f"{label} #{k + 1}", *rest) for k, (label, *rest) in enumerate(runs)]  # type: ignore[misc]
    return runs


def baseline_index(runs: list[Compared], baseline: str) -> int | None:
    """The first run whose label, path or file name is --baseline (a merged run's: any of its parts')."""
    names = [[r[0], r[1], *(n for p in r[1].split(MERGED) for n in (p, Path(p).name))] for r in runs]
    match = [k for k, n in enumerate(names) if baseline in n or str(Path(baseline)) in n]
    return match[0] if match else None
