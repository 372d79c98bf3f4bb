"""Each server endpoint's metrics folded on its own, and every endpoint taken together.

Counters are made monotonic across an endpoint's restarts and counted from when it first answered, so a
server that joins late adds none of its earlier history; totals are derived from the endpoints, never kept
as the only figure.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.history import ServerHistory

HISTORY_LEN = 1800  # KV occupancy samples kept for the server panel's history
RATE_WINDOW_S = 10.0  # server throughput is averaged over this long

# Normalized counters (drivers/telemetry/metrics.py) that analysis takes deltas of.
COUNTERS = ("prefix_queries", "prefix_hits", "prompt_tokens", "prompt_computed", "generation_tokens", "preemptions")
COUNTERS += ("kv_transferred",)  # a prefill/decode split's decode side: KV received, not computed or cached
COUNTERS += ("spec_accepted", "spec_drafted")  # speculative decoding's draft tokens, where the server speculates
COUNTERS += ("requests",)  # requests finished: with prompt_tokens, they tell which backend served a turn
COUNTERS += ("router_requests", "router_retries", "router_errors")  # a router's own
# A router creates these series (and each worker's) with their first count: one that appears after the router
# first answered counted from zero then, not from the value first seen.
_LAZY = ("router_", "worker ")
# The normalized field for one engine instance's KV pool in tokens (never summed over data-parallel ranks):
# the metrics normalizer writes it, the endpoint views read it.
ENGINE_POOL = "kv_engine_tokens"


class _Rates:
    """Prefill and decode tokens/s from a `rates` dict (an endpoint's, or every endpoint's summed)."""

    __slots__ = ()
    rates: dict[str, float]

    @property
    def prefill_rate(self) -> float | None:
        """Computed prompt tokens/s (cache hits included where the engine does not split them)."""
        return self.rates.get("prompt_computed", self.rates.get("prompt_tokens"))

    @property
    def decode_rate(self) -> float | None:
        return self.rates.get("generation_tokens")


@dataclass(slots=True)
class EndpointView(_Rates):
    """One server's metrics, folded on their own: counters made monotonic
    across its restarts, a baseline taken when it first answered (so a server
    that joins late adds none of its earlier history), rates, errors."""

    name: str
    role: str = "both"
    engine: str | None = None
    values: dict[str, float] = field(default_factory=dict)  # latest; counters monotonic
    missing: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the last scrape's error (cleared on success)
    kv_peak: float | None = None
    baseline: dict[str, float] = field(default_factory=dict)  # each counter when first seen
    rates: dict[str, float] = field(default_factory=dict)  # tokens/s over the last RATE_WINDOW_S
    first_sample_t: float | None = None
    last_sample_t: float | None = None
    last_asked_t: float | None = None  # when the last sample's scrape was sent, where known
    # A router: requests it sent each worker since it first answered (by the worker's label), across its restarts.
    workers: dict[str, float] = field(default_factory=dict)
    _raw: dict[str, float] = field(default_factory=dict)
    _offset: dict[str, float] = field(default_factory=dict)
    _window: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def _monotonic(self, key: str, v: float) -> float:
        """A counter's value made monotonic across the server's restarts (a reset continues from where it was)."""
        before = self._raw.get(key)
        if before is not None and v < before:
            self._offset[key] = self._offset.get(key, 0.0) + before - v
        self._raw[key] = v
        v += self._offset.get(key, 0.0)
        self.baseline.setdefault(key, 0.0 if self.first_sample_t is not None and key.startswith(_LAZY) else v)
        return v

    def fold(self, e: ev.MetricsSample) -> None:
        self.engine, self.missing, self.error = e.engine, dict(e.missing), None
        values: dict[str, float] = {}
        for k, v in e.values.items():
            values[k] = self._monotonic(k, v) if k in COUNTERS else v
        self.values = values
        for w, v in e.workers.items():  # since the router first answered, as every counter here
            key = "worker " + w
            self.workers[w] = self._monotonic(key, v) - self.baseline.setdefault(key, v)
        kv = values.get("kv_usage")
        if kv is not None:
            self.kv_peak = kv if self.kv_peak is None else max(self.kv_peak, kv)
        counters = self.since_start()
        # Rates over a window: engines bump prompt counters per request, not per chunk.
        window = self._window
        window.append((e.t, counters))
        while len(window) > 2 and window[1][0] <= e.t - RATE_WINDOW_S:
            window.popleft()
        t0, c0 = window[0]
        if e.t > t0:
            self.rates = {k: (counters[k] - c0[k]) / (e.t - t0) for k in counters if k in c0}
        if self.first_sample_t is None:
            self.first_sample_t = e.t
        self.last_sample_t, self.last_asked_t = e.t, e.asked_t

    def sampled_after(self, t: float) -> bool:
        """Whether the last sample holds the server's state after `t`: its scrape was sent after `t` (a scrape
        answered after `t` may have been read before it: vLLM's counters then lack what came between)."""
        since = self.last_asked_t if self.last_asked_t is not None else self.last_sample_t
        return since is not None and since > t

    def since_start(self) -> dict[str, float]:
        """Each counter's growth since this server first answered."""
        v = self.values
        return {k: v[k] - self.baseline[k] for k in COUNTERS if k in v}

    def hit_rate_since_start(self) -> float | None:
        return counters_hit_rate(self.since_start())

    @property
    def engine_pool(self) -> float | None:
        """One engine instance's KV pool in tokens (never summed over data-parallel ranks)."""
        return self.values.get(ENGINE_POOL) or self.values.get("kv_capacity_tokens")


@dataclass(slots=True)
class ServerView(_Rates):
    """Every endpoint together: counters are the sum of each one's growth
    since it first answered; request gauges and pools add up; KV usage is
    the share of all pools in use (the fullest one's where a pool is unknown)."""

    values: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # fields no endpoint exposes, and why
    engine: str | None = None
    kv_history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    kv_peak: float | None = None
    # Requests waiting for the scheduler, summed over endpoints: a sweep stops a point whose queue keeps growing.
    waiting_history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    waiting_peak: float | None = None
    rates: dict[str, float] = field(default_factory=dict)  # tokens/s, summed over endpoints
    last_sample_t: float | None = None
    history: ServerHistory = field(default_factory=ServerHistory)  # the whole run's lines, for pictures

    def hit_rate_since_start(self) -> float | None:
        return counters_hit_rate(self.values)  # its counters are growth since each endpoint first answered

    def merge(self, answered: list[EndpointView], t: float) -> None:
        """Every endpoint that answered, taken together again after one of them was sampled at `t`."""
        self.values, self.rates, self.missing = merge_endpoints(answered)
        self.engine = "/".join(sorted({x.engine or "?" for x in answered}))
        v = self.values
        kv, waiting = v.get("kv_usage"), v.get("waiting")
        if kv is not None:
            self.kv_history.append((t, kv))
            self.kv_peak = kv if self.kv_peak is None else max(self.kv_peak, kv)
        if waiting is not None:
            self.waiting_history.append((t, waiting))
            self.waiting_peak = waiting if self.waiting_peak is None else max(self.waiting_peak, waiting)
        hist = self.history
        lines = ((hist.kv, kv), (hist.hit, self.hit_rate_since_start()), (hist.running, v.get("running")))
        for line, value in (*lines, (hist.waiting, waiting)):
            if value is not None:
                line.add(t, value)
        self.last_sample_t = t


# The engine names a scrape of a router's metrics reads as (the scraper's router profiles).
ROUTER_ENGINES = ("vllm-router", "sglang-router", "sgl-router")


def is_router(ep: EndpointView) -> bool:
    """A router's endpoint (given the role, or found serving vllm-router's or sglang-router's names): it serves no
    model, so it is kept out of the model servers' totals and shows its requests per worker instead."""
    return ep.role == "router" or ep.engine in ROUTER_ENGINES


def counters_hit_rate(counters: dict[str, float]) -> float | None:
    """The prefix cache's hit rate from its (queries, hits) counters; None when either is missing or no query ran."""
    if "prefix_queries" not in counters or "prefix_hits" not in counters:
        return None
    dq = counters["prefix_queries"]
    return counters["prefix_hits"] / dq if dq > 0 else None


def merge_endpoints(views: list[EndpointView]) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """(values, rates, missing) of a set of endpoints taken together."""
    values: dict[str, float] = {}
    rates: dict[str, float] = {}
    for ep in views:
        for k, v in ep.values.items():
            if k == "kv_usage" or k == ENGINE_POOL:
                continue
            values[k] = values.get(k, 0.0) + (v - ep.baseline[k] if k in COUNTERS else v)
        for k, r in ep.rates.items():
            rates[k] = rates.get(k, 0.0) + r
    usage = [(ep.values["kv_usage"], ep.values.get("kv_capacity_tokens")) for ep in views if "kv_usage" in ep.values]
    if usage:
        if all(cap for _, cap in usage):
            values["kv_usage"] = sum(u * cap for u, cap in usage) / sum(cap for _, cap in usage)  # type: ignore[misc]
        else:
            values["kv_usage"] = max(u for u, _ in usage)
    missing = dict(views[0].missing) if views else {}
    for ep in views[1:]:
        missing = {k: r for k, r in missing.items() if k in ep.missing}
    return values, rates, missing
