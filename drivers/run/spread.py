"""Where a run's sessions run and when they start: in the run's own process, on local worker processes
(--workers N) or on Ray actors over a cluster's nodes (--cluster), and at an agreed wall-clock time (--start-at,
how shards start together). The drive itself is runner.py's; the workers' protocol is workers.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.hub import EventHub
from rampwatch.drivers.run.local_worker import LocalWorker
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.trace_spread import trace_shares
from rampwatch.drivers.run.worker_wire import SessionPlan
from rampwatch.drivers.run.workers import WorkerLink, WorkerPool

if TYPE_CHECKING:
    from rampwatch.drivers.run.ray_workers import RayCluster
    from rampwatch.drivers.run.trace_run import TraceReplay


HOLD_S = 0.25  # the coordinator holds the workers' events this long at least, to merge them in time order
MAX_HOLD_S = 5.0  # ... and at most this long, however far behind a worker's lines are: memory stays bounded
BEHIND_S = 1.0  # the workers' events this late: a notice says the live view lags (at most every BEHIND_EVERY_S)
BEHIND_EVERY_S = 30.0


def release_point(now: float, through: float) -> float:
    """Up to when the held events can go: every running worker has sent what it stamped up to `through`
    (WorkerPool.through), less HOLD_S for a batch of stamps sent a pass after the last; never more than
    MAX_HOLD_S behind `now`."""
    return max(now - MAX_HOLD_S, min(now, through) - HOLD_S)


def on_workers(cfg: RunConfig) -> bool:
    """Whether the sessions run on workers (the coordinator drives none itself)."""
    return cfg.workers > 1 or cfg.cluster is not None


def at_most_a_worker_a_session(cfg: RunConfig, sessions: int) -> RunConfig:
    """No more workers than sessions to run (a sweep's first points, a short trace): each would start for none.
    The sessions keep their workers (session k's is worker (k-1) mod N either way)."""
    return cfg if cfg.workers <= max(1, sessions) else dataclasses.replace(cfg, workers=max(1, sessions))


class Spread:
    """The run's workers, if any: the Ray connection they are placed through, the pool that drives them, and the
    hub's merge of their events in time order."""

    def __init__(self, hub: EventHub, clock: Callable[[], float]):
        self.hub, self.clock = hub, clock
        self.cluster: RayCluster | None = None  # --cluster: the Ray connection its workers are placed through
        self._pool: WorkerPool | None = None
        self._spawned: dict[int, LocalWorker] = {}  # local workers' processes started early, not yet handed out

    def connect(self, cfg: RunConfig) -> RunConfig:
        """--cluster: connect to Ray (imported there alone, only when asked for); the config then holds the
        workers the cluster gives, which the header records. Local workers' processes start now, to import what
        they run while the run prepares."""
        if cfg.cluster is None:
            if on_workers(cfg):
                self._spawned = {i: LocalWorker().spawn() for i in range(cfg.workers)}
            return cfg
        from rampwatch.drivers.run.ray_workers import RayCluster

        self.cluster = RayCluster(cfg)
        return dataclasses.replace(cfg, workers=self.cluster.connect())

    def trim(self, cfg: RunConfig | None) -> None:
        """End the processes spawned early that `cfg`'s workers will not take (fewer workers than sessions asked
        for, or none on workers); all of them for None (the run is over, or never started)."""
        keep = cfg.workers if cfg is not None and on_workers(cfg) and cfg.cluster is None else 0
        for i in [i for i in self._spawned if i >= keep]:
            self._spawned.pop(i).discard()

    def pool(
        self,
        cfg: RunConfig,
        plan: SessionPlan,
        gate: TurnGate,
        arrivals: Callable[[], list[float] | None],
        limit_at: float | None,
        trace: TraceReplay | None = None,
    ) -> WorkerPool:
        """The pool that drives the sessions on the workers; their events are held back a moment from now on to
        merge in time order (hub.hold; `release_loop` lets them go). With --trace, the workers are named the
        trace's sessions they will run (the coordinator hands them out: trace_spread.py)."""
        self.hub.hold()
        self.trim(cfg)
        # Worker i's first start takes the process spawned for it; a replacement (--workers-restart), a new one.
        links: Callable[[int], WorkerLink] = lambda i: self._spawned.pop(i, None) or LocalWorker()  # noqa: E731
        if self.cluster is not None:  # --cluster: Ray actors over its nodes (ray_workers.py)
            links = self.cluster.link
        pool = self._pool = WorkerPool(cfg, plan, self.hub.emit, self.clock, gate, links, cfg.workers, arrivals)
        pool.time_limit_at = limit_at
        if trace is not None:
            pool.session_names = trace_shares(list(trace.schedules), cfg.workers)
        return pool

    async def release_loop(self) -> None:
        """Let the held events go in time order, as far as every running worker has sent its own; say so when
        that is a second or more behind (the coordinator short of CPU, or a worker's lines slow to reach it)."""
        said = -math.inf
        while True:
            await asyncio.sleep(HOLD_S / 4)
            now = self.clock()
            through = self._pool.through() if self._pool is not None else math.inf
            behind = now - min(now, through)  # how late the slowest running worker's events reach this process
            if behind >= BEHIND_S and now - said >= BEHIND_EVERY_S:
                said = now
                what = f"the workers' events reach the coordinator {behind:.1f}s late: the live view lags as much"
                if behind > MAX_HOLD_S - HOLD_S:
                    what += f" (past {MAX_HOLD_S:g}s, the recording does not keep them in time order)"
                self.hub.emit(ev.Notice(t=now, level="warn", message=what))
            self.hub.release(release_point(now, through))

    async def start_at(self, cfg: RunConfig) -> float | None:
        """--start-at: wait for the agreed wall-clock time (shards start together), saying so; returns the time
        limit on the run's clock counted from then (None: no --start-at, or no --time-limit)."""
        at = cfg.start_at
        if at is None:
            return None
        wait = at - time.time()
        when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
        if wait > 0:
            self.hub.emit(ev.Notice(t=self.clock(), level="info", message=f"waiting {wait:.1f}s for --start-at {when}"))
            self.hub.flush()
            await asyncio.sleep(wait)
        else:  # a shard that started late starts at once, and says by how much
            message = f"--start-at {when} was {-wait:.1f}s ago: starting now, late"
            self.hub.emit(ev.Notice(t=self.clock(), level="warn", message=message))
        return self.clock() + cfg.time_limit if cfg.time_limit is not None else None

    async def aclose(self) -> None:
        """--cluster: disconnect from Ray (a runtime started for the run stops; a cluster joined goes on). Local
        workers' processes spawned and never taken (a run that never started) end."""
        self.trim(None)
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            await cluster.aclose()
