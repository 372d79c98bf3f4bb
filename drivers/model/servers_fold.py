"""The servers' side of the fold: each endpoint's metrics folded on its own, the servers merged into one view,
and the GPUs. RunState (state.py) holds one and adds what the sessions take from it (a turn's KV peak, its
transferred KV, its backend)."""

from __future__ import annotations

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.endpoints import EndpointView, ServerView, is_router
from rampwatch.drivers.model.gpu_fleet import GpuFleet
from rampwatch.drivers.model.log import LogEntry


class ServersFold:
    def __init__(self) -> None:
        self.server = ServerView()
        self.endpoints: dict[str, EndpointView] = {}  # by name, in the order they first answered
        self.gpu_fleet = GpuFleet()  # every source's GPUs

    def endpoint(self, name: str, header: ev.Header | None) -> EndpointView:
        ep = self.endpoints.get(name)
        if ep is None:
            listed = next((x for x in (header.endpoints if header else []) if x.name == name), None)
            ep = self.endpoints[name] = EndpointView(name=name, role=listed.role if listed else "both")
        return ep

    def sample(self, e: ev.MetricsSample, header: ev.Header | None) -> EndpointView:
        """Fold one endpoint's sample, then the model servers (not a router) into the server view."""
        ep = self.endpoint(e.source, header)
        if e.role is not None:
            ep.role = e.role
        ep.fold(e)
        live = [x for x in self.endpoints.values() if x.last_sample_t is not None and not is_router(x)]
        self.server.merge(live, e.t)
        return ep

    def error(self, e: ev.MetricsError, header: ev.Header | None) -> LogEntry | None:
        """A scrape's error (or its recovery); the log line when that changed."""
        ep = self.endpoint(e.source, header)
        said = None
        if ep.error != (e.error or None):
            said = (
                LogEntry(e.t, "warn", f"metrics {e.source}: {e.error}")
                if e.error
                else LogEntry(e.t, "info", f"metrics {e.source}: answering again")
            )
        ep.error = e.error or None
        return said

    def gpu(self, e: ev.GpuSample) -> None:
        self.gpu_fleet.sample(e)
        utils = [g.util for g in e.gpus if g.util is not None]
        if utils:
            self.server.history.gpu.add(e.t, sum(utils) / len(utils))

    def gpu_missing(self, e: ev.GpuUnavailable) -> LogEntry | None:
        return LogEntry(e.t, "warn", f"GPU: {e.reason}") if self.gpu_fleet.unavailable(e) else None

    def cache_counters(self) -> tuple[float, float] | None:
        """The prefix cache's (queries, hits) since start, for a turn's own hit rate."""
        v = self.server.values
        return (v["prefix_queries"], v["prefix_hits"]) if "prefix_queries" in v and "prefix_hits" in v else None
