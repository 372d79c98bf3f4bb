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
from rampwatch.drivers.run.merge_delay import HOLD_S, MergeDelay
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.trace_spread import trace_shares
from rampwatch.drivers.run.worker_wire import SessionPlan
from rampwatch.drivers.run.workers import WorkerLink, WorkerPool

if TYPE_CHECKING:
    from rampwatch.drivers.run.ray_workers import RayCluster
    from rampwatch.drivers.run.trace_run import TraceReplay


BEHIND_S = 1.0  # workers' events this late say the coordinator is behind (a notice, at most every BEHIND_EVERY_S)
BEHIND_EVERY_S = 30.0


def on_workers(cfg: RunConfig) -> bool:
    """Whether the sessions run on workers (the coordinator drives none itself)."""
    return cfg.workers > 1 or cfg.cluster is not None


class Spread:
    """The run's workers, if any: the Ray connection they are placed through, the pool that drives them, and the
    hub's merge of their events in time order."""

    def __init__(self, hub: EventHub, clock: Callable[[], float]):
        self.hub, self.clock = hub, clock
        self.cluster: RayCluster | None = None  # --cluster: the Ray connection its workers are placed through
        self.delay = MergeDelay()  # how long the workers' events are held to merge them in time order

    def connect(self, cfg: RunConfig) -> RunConfig:
        """--cluster: connect to Ray (imported there alone, only when asked for); the config then holds the
        workers the cluster gives, which the header records."""
        if cfg.cluster is None:
            return cfg
        from rampwatch.drivers.run.ray_workers import RayCluster

        self.cluster = RayCluster(cfg)
        return dataclasses.replace(cfg, workers=self.cluster.connect())

    @staticmethod
    def fit(cfg: RunConfig, sessions: int) -> RunConfig:
        """No more workers than sessions to run (a sweep's first points, a short trace): each would start for
        none. The sessions keep their workers (session k's is worker (k-1) mod N either way)."""
        return cfg if cfg.workers <= max(1, sessions) else dataclasses.replace(cfg, workers=max(1, sessions))

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
        links: Callable[[int], WorkerLink] = lambda i: LocalWorker()  # noqa: E731
        if self.cluster is not None:  # --cluster: Ray actors over its nodes (ray_workers.py)
            links = self.cluster.link
        pool = WorkerPool(cfg, plan, self._merge, self.clock, gate, links, cfg.workers, arrivals)
        pool.time_limit_at = limit_at
        if trace is not None:
            pool.session_names = trace_shares(list(trace.schedules), cfg.workers)
        return pool

    def _merge(self, e: ev.AnyEvent, line: bytes | None = None) -> None:
        """An event of the workers' (or the pool's own), held to be merged; how late it came sets the hold."""
        now = self.clock()
        self.delay.note(now - e.t, now)
        self.hub.emit(e, line)

    async def release_loop(self) -> None:
        said = -math.inf
        while True:
            await asyncio.sleep(HOLD_S / 4)
            now = self.clock()
            late = self.delay.late_s(now)
            if late >= BEHIND_S and now - said >= BEHIND_EVERY_S:  # said once in a while, not at every pass
                said = now
                why = f"the coordinator reads its workers' events {late:.1f}s late: the live view lags as much"
                self.hub.emit(ev.Notice(t=now, level="warn", message=f"{why} (the recording keeps them in order)"))
            self.hub.release(now - self.delay.hold_s(now))

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
        """--cluster: disconnect from Ray (a runtime started for the run stops; a cluster joined goes on)."""
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            await cluster.aclose()
