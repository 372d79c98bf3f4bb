"""Every GPU source of a run taken together (NVML, each dcgm-exporter, Prometheus): one node's source failing
leaves the others shown."""

from __future__ import annotations

from dataclasses import dataclass, field

from rampwatch.drivers.model import events as ev


@dataclass(slots=True)
class GpuFleet:
    """Each source's latest readings, and all of them merged (by node, then index, where there are several)."""

    readings: list[ev.GpuReading] = field(default_factory=list)
    reason: str | None = None  # why there are none (or why a source has none)
    _sources: dict[str, list[ev.GpuReading]] = field(default_factory=dict)

    def sample(self, e: ev.GpuSample) -> None:
        self._sources[e.source] = list(e.gpus)
        self._merge(None)

    def unavailable(self, e: ev.GpuUnavailable) -> bool:
        """A source has no GPUs; whether that is news (its reason changed)."""
        news = self.reason != e.reason
        self._sources[e.source] = []
        self._merge(e.reason)
        return news

    def _merge(self, reason: str | None) -> None:
        gpus = [g for readings in self._sources.values() for g in readings]
        self.readings = sorted(gpus, key=lambda g: (g.node, g.index)) if len(self._sources) > 1 else gpus
        self.reason = reason if reason is not None or not gpus else None
