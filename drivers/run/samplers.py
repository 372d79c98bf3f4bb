"""What a run reads beside its sessions: each endpoint's /metrics, a Prometheus server, and the GPUs (NVML or
dcgm-exporter), each sampler a task on the driver's loop, with one last read once the run has ended."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.telemetry.gpu import GpuSampler
from rampwatch.drivers.telemetry.metrics import MetricsScraper
from rampwatch.drivers.telemetry.prometheus import PrometheusReader


class Samplers:
    """The run's metrics scrapers and GPU samplers, made from its config."""

    FIRST_READ_WAIT_S = 5.0  # the longest a run's first turn waits for the servers' first scrapes
    SAY_WAITING_AFTER_S = 1.0  # a wait past this says whom it waits for (an info Notice)

    def __init__(
        self,
        cfg: RunConfig,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        tls: ssl.SSLContext,
    ):
        self.emit, self.clock = emit, clock
        headers = cfg.metrics_headers()
        self.metrics: list[MetricsScraper | PrometheusReader] = [
            MetricsScraper(s.url, cfg.scrape_interval, emit, clock, headers=headers, verify=tls, source=s.name)
            for s in cfg.metrics_sources()
        ]
        if cfg.prometheus:
            self.metrics.append(
                PrometheusReader(
                    cfg.prometheus,
                    max(cfg.scrape_interval, 1.0),
                    emit,
                    clock,
                    verify=tls,
                    matches=cfg.prometheus_engines(),
                    gpu_matchers=cfg.prometheus_gpus(),
                )
            )
        self.gpus = [
            GpuSampler(source, max(cfg.scrape_interval, 1.0), emit, clock, verify=tls, headers=headers)
            for source in cfg.gpu_sources()
        ]

    def start(self) -> list[asyncio.Task[None]]:
        """Every sampler running, a task each (the caller cancels them when the run ends)."""
        return [asyncio.create_task(s.run()) for s in (*self.metrics, *self.gpus)]

    async def first_reads(self) -> None:
        """Every metrics reader's first read in (answered or failed), at most FIRST_READ_WAIT_S: the run's first
        turns then have each server's counters before them to move from (which backend served a turn, the hit rate
        of turn 1), rather than a race with the first scrape. A wait past SAY_WAITING_AFTER_S says whom it waits
        for (the Sessions panel has nothing to show until the first turn)."""
        if not self.metrics:
            return
        first_scrapes = asyncio.ensure_future(asyncio.gather(*(s.read_once.wait() for s in self.metrics)))
        bound, say_at = self.FIRST_READ_WAIT_S, min(self.SAY_WAITING_AFTER_S, self.FIRST_READ_WAIT_S)
        try:
            await asyncio.wait([first_scrapes], timeout=say_at)
            if bound > say_at and (silent := self._silent()):
                self._say("info", f"waiting for the first answer from {silent}: the first turn waits up to {bound:g} s")
                await asyncio.wait([first_scrapes], timeout=bound - say_at)
        finally:
            first_scrapes.cancel()
        if silent := self._silent():  # the readers' own flags: one that answered as the wait ran out has answered
            self._say("warn", f"no first answer from {silent} in {bound:g} s: the run starts anyway")

    def _silent(self) -> str:
        return ", ".join(s.source for s in self.metrics if not s.read_once.is_set())

    def _say(self, level: ev.Level, message: str) -> None:
        self.emit(ev.Notice(t=self.clock(), level=level, message=message))

    async def final_read(self) -> None:
        """One last read of the metrics, so the report's server figures cover the last turns too; a server too
        slow to answer now says nothing after the run's last event."""
        if not self.metrics:
            return
        last = [asyncio.create_task(s.final_read()) for s in self.metrics]
        _, slow = await asyncio.wait(last, timeout=max(s.FINAL_WAIT_S for s in self.metrics))
        for t in slow:
            t.cancel()
        await asyncio.gather(*last, return_exceptions=True)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.metrics), return_exceptions=True)
