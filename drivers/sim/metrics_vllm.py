"""vLLM's /metrics surface for the simulated engine: vLLM's metric names,
labels and histogram buckets, counted from the engine's own step callbacks."""

from __future__ import annotations

import bisect
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rampwatch.drivers.sim.engine import SimEngine, SimRequest, StepStats
from rampwatch.drivers.sim.profiles import SimProfile


def observe_many(histogram: Histogram, value: float, n: int) -> None:
    """`n` observations of one value at once (a burst's tokens, 0 s apart). prometheus_client has no bulk
    observe, and a call per token cost the 'fast' profile more CPU than the client it is there to measure; this
    does what n observe() calls do (its sum, the first bucket whose bound holds the value)."""
    histogram._sum.inc(value * n)  # noqa: SLF001
    histogram._buckets[bisect.bisect_left(histogram._upper_bounds, value)].inc(n)  # noqa: SLF001


# vLLM's histogram buckets; the sglang surface serves the same ones (a table: kept out of the formatter).
# fmt: off
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQ_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# fmt: on

# vLLM's latency histograms: name: (help text, buckets), in the order VllmMetrics unpacks them.
LATENCY_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", REQ_BUCKETS),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", REQ_BUCKETS),
    "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", REQ_BUCKETS),
    "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", REQ_BUCKETS),
}


class VllmMetrics:
    """vLLM's metric names and labels, in a registry of this server's own."""

    def __init__(self, profile: SimProfile, model: str):
        self.registry = r = CollectorRegistry()
        lab = {"model_name": model, "engine": "0"}
        names = list(lab)

        def g(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, names + list(extra), registry=r)

        def c(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, names + list(extra), registry=r)

        def h(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.").labels(**lab)
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**lab)
        self.kv = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**lab)
        self.queries = c(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(**lab)
        self.hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(**lab)
        self.prompt = c("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**lab)
        by_source = c("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",))
        self.computed = by_source.labels(**lab, source="local_compute")
        self.cache_hit = by_source.labels(**lab, source="local_cache_hit")
        self.external = by_source.labels(**lab, source="external_kv_transfer")
        self.ext_queries = c(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector "
            "cross-instance cache sharing, in terms of number of queried tokens.",
        ).labels(**lab)
        self.ext_hits = c(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector "
            "cross-instance cache sharing, in terms of number of cached tokens.",
        ).labels(**lab)
        self.generation = c("vllm:generation_tokens", "Number of generation tokens processed.").labels(**lab)
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(**lab)
        success = c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))
        self.success = {
            reason: success.labels(**lab, finished_reason=reason)
            for reason in ("stop", "length", "abort", "error", "repetition")
        }
        self.ttft, self.itl, self.e2e, self.queue, self.prefill, self.decode = (
            h(name, doc, buckets).labels(**lab) for name, (doc, buckets) in LATENCY_HISTOGRAMS.items()
        )
        self.iteration = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            names,
            buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
            registry=r,
        ).labels(**lab)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "enable_prefix_caching", "engine", "kv_cache_size_tokens", "num_gpu_blocks", "simulated"],
            registry=r,
        )
        info.labels(
            block_size=str(profile.block_size),
            enable_prefix_caching="True",
            engine="0",
            kv_cache_size_tokens=str(profile.kv_tokens),
            num_gpu_blocks=str(profile.kv_tokens // profile.block_size),
            simulated="True",
        ).set(1.0)

    def render(self, engine: SimEngine) -> bytes:
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv.set(engine.pool.usage())
        return generate_latest(self.registry)

    def stats(self) -> StepStats:
        def admit(r: SimRequest) -> None:
            # As vLLM counts a KV connector's tokens: local hits stay local, the transferred rest is external.
            external = r.cached_tokens - r.local_cached
            self.queries.inc(r.prompt_tokens)
            self.hits.inc(r.local_cached)
            self.prompt.inc(r.prompt_tokens)
            self.computed.inc(r.prompt_tokens - r.cached_tokens)
            self.cache_hit.inc(r.local_cached)
            if r.remote_kv:
                self.external.inc(external)
                self.ext_queries.inc(r.prompt_tokens - r.local_cached)
                self.ext_hits.inc(external)
            self.queue.observe((r.scheduled_t or r.arrival) - r.arrival)

        def first(r: SimRequest) -> None:
            self.ttft.observe(r.first_t - r.taken)  # type: ignore[operator]
            self.prefill.observe(r.first_t - (r.scheduled_t or r.arrival))  # type: ignore[operator]
            self.generation.inc()

        def tokens(r: SimRequest, dt: float, n: int) -> None:
            self.itl.observe(dt)
            if n > 1:
                observe_many(self.itl, 0.0, n - 1)
            self.generation.inc(n)

        def finish(r: SimRequest) -> None:
            self.success[r.finish_reason or "stop"].inc()
            now = time.monotonic()
            self.e2e.observe(now - r.taken)
            if r.first_t is not None:
                self.decode.observe((r.last_t or now) - r.first_t)

        return StepStats(
            on_admit=admit,
            on_first=first,
            on_tokens=tokens,
            on_finish=finish,
            on_step=self.iteration.observe,
            on_preempt=lambda r: self.preemptions.inc(),
        )
