"""The driver workers of a run (--workers N, --cluster, merged shards) as their events tell it: who ran which
sessions where, how well their clocks agree with the coordinator's, and which were lost."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from rampwatch.drivers.model import events as ev

LOST = "worker lost"  # the error of a turn in flight on a worker that died: the client's failure, not the server's


@dataclass
class WorkerView:
    worker: int
    pid: int = 0
    node: str = ""
    sessions: list[str] = field(default_factory=list)
    offset_s: float | None = None  # the latest clock exchange's offset (None: not measured)
    uncertainty_s: float | None = None  # ... its half round trip
    worst_offset_s: float = 0.0  # the largest |offset| + uncertainty seen: what cross-worker figures carry
    lost: ev.WorkerLost | None = None
    replaces: int | None = None  # --workers-restart: the lost worker whose sessions it went on with


class WorkerLedger:
    """Every worker by its id; empty for a run of one driver."""

    def __init__(self) -> None:
        self.by_id: dict[int, WorkerView] = {}

    def _view(self, worker: int) -> WorkerView:
        view = self.by_id.get(worker)
        if view is None:
            view = self.by_id[worker] = WorkerView(worker)
        return view

    def started(self, e: ev.WorkerStarted) -> None:
        view = self._view(e.worker)
        view.pid, view.node, view.sessions, view.replaces = e.pid, e.node, list(e.sessions), e.replaces

    def clock(self, e: ev.WorkerClock) -> None:
        view = self._view(e.worker)
        view.offset_s, view.uncertainty_s = e.offset_s, e.uncertainty_s
        view.worst_offset_s = max(view.worst_offset_s, abs(e.offset_s) + e.uncertainty_s)

    def lost(self, e: ev.WorkerLost) -> None:
        self._view(e.worker).lost = e

    @property
    def clock_uncertainty_s(self) -> float | None:
        """How far apart two workers' stamps may be beyond what they measured: the worst offset plus its
        uncertainty over every worker (None: one driver, nothing to carry)."""
        measured = [v.worst_offset_s for v in self.by_id.values() if v.offset_s is not None]
        return max(measured) if measured else None

    @property
    def lost_workers(self) -> list[ev.WorkerLost]:
        return [v.lost for v in self.by_id.values() if v.lost is not None]


class WorkerFigures(msgspec.Struct):
    """One driver worker in the report: where it ran, what it ran, how well its clock agreed, whether it was lost."""

    worker: int
    node: str
    pid: int
    sessions: list[str]
    clock_offset_ms: float | None  # its worst |offset| + uncertainty over the run (None: not measured, a shard)
    lost: str | None = None  # why it was lost (None: it finished)
    lost_sessions: list[str] = []  # its sessions that ended with it
    lost_turns: int = 0  # its turns in flight, recorded failed `worker lost`
    resumed_on: int | None = None  # --workers-restart: the worker its sessions went on on (None: they ended)
    replaces: int | None = None  # --workers-restart: the lost worker whose sessions it went on with


def worker_figures(ledger: WorkerLedger) -> list[WorkerFigures] | None:
    """Every worker, in order; None for a run of one driver."""
    if not ledger.by_id:
        return None
    return [
        WorkerFigures(
            worker=v.worker,
            node=v.node,
            pid=v.pid,
            sessions=v.sessions,
            clock_offset_ms=1000 * v.worst_offset_s if v.offset_s is not None else None,
            lost=v.lost.reason if v.lost is not None else None,
            lost_sessions=list(v.lost.sessions) if v.lost is not None else [],
            lost_turns=v.lost.turns_lost if v.lost is not None else 0,
            resumed_on=v.lost.resumed_on if v.lost is not None else None,
            replaces=v.replaces,
        )
        for _, v in sorted(ledger.by_id.items())
    ]
