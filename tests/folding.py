"""Folding events as a run does: the fold (RunState) and, listening after it, the Prometheus exporter that reads
it, so a test sees the exporter's series and the report of one fold."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.telemetry.client_metrics import ClientMetrics


def fold(
    header: ev.Header | None,
    events: Iterable[ev.AnyEvent],
    clock: Callable[[], float] = lambda: 0.0,
    run: str = "",
    after: Callable[[RunState, ClientMetrics, ev.AnyEvent], None] | None = None,
) -> tuple[RunState, ClientMetrics]:
    """The events folded into a RunState with a ClientMetrics listening; `after(state, exporter, event)` is called
    after each one."""
    state = RunState(header)
    exporter = ClientMetrics(lambda: state, clock, run=run)
    for e in events:
        state.apply(e)
        exporter(e)
        if after is not None:
            after(state, exporter, e)
    return state, exporter


def sample(exporter: ClientMetrics, name: str, session: str, run: str = "", **labels: str) -> float:
    """One series' value for a session (0 where it has none)."""
    return exporter.registry.get_sample_value(name, {"session": session, "run": run, **labels}) or 0.0


def fold_state(header: ev.Header | None, events: Iterable[ev.AnyEvent]) -> RunState:
    """The events folded into a RunState, as `report` and `export` fold a recording."""
    state = RunState(header)
    for e in events:
        state.apply(e)
    return state
