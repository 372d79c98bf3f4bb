"""SGLang's /metrics surface for the simulated engine (the `sglang` flavour)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rampwatch.drivers.sim.engine import SimEngine, SimRequest, StepStats
from rampwatch.drivers.sim.metrics_vllm import ITL_BUCKETS, REQ_BUCKETS, TTFT_BUCKETS, observe_many
from rampwatch.drivers.sim.profiles import SimProfile

# SGLang's latency histograms: name: (help text, buckets), in the order SglangMetrics unpacks them.
LATENCY_HISTOGRAMS = {
    "sglang:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "sglang:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    "sglang:e2e_request_latency_seconds": ("Histogram of End-to-end request latency in seconds", REQ_BUCKETS),
}


class SglangMetrics:
    """SGLang 0.5's metric names and labels (scheduler series with engine_type and ranks), served as its
    multiprocess collector does (no _created series). Like SGLang releases without
    sglang:cached_tokens_total, nothing here counts prefix-cache hits: only sglang:cache_hit_rate, the
    ratio of the last report."""

    def __init__(self, profile: SimProfile, model: str):
        self.registry = r = CollectorRegistry()
        sched = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        tok = {"model_name": model, "engine_type": "unified"}

        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(sched), registry=r, multiprocess_mode="mostrecent").labels(**sched)

        self.running = g("sglang:num_running_reqs", "The number of running requests.")
        self.waiting = g("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.kv = g("sglang:token_usage", "The token usage.")
        self.kv_used = g("sglang:kv_used_tokens", "The number of used KV tokens.")
        self.capacity = g("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.capacity.set(profile.kv_tokens)
        self.hit_ratio = g("sglang:cache_hit_rate", "The prefix cache hit rate (of the last report).")
        self.gen_throughput = g("sglang:gen_throughput", "The generation throughput (token/s).")

        def c(name: str, doc: str) -> Counter:
            return Counter(name, doc, list(tok), registry=r).labels(**tok)

        self.prompt = c("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation = c("sglang:generation_tokens", "Number of generation tokens processed.")
        self.ttft, self.itl, self.e2e = (
            Histogram(name, doc, list(tok), buckets=buckets, registry=r).labels(**tok)
            for name, (doc, buckets) in LATENCY_HISTOGRAMS.items()
        )
        self._generated = 0  # tokens generated so far, for gen_throughput
        self._last_gen = (time.monotonic(), 0)

    def stats(self) -> StepStats:
        def admit(r: SimRequest) -> None:
            self.prompt.inc(r.prompt_tokens)
            self.hit_ratio.set(r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0)

        def first(r: SimRequest) -> None:
            self.ttft.observe(r.first_t - r.taken)  # type: ignore[operator]
            self._generate()

        def tokens(r: SimRequest, dt: float, n: int) -> None:
            self.itl.observe(dt)
            if n > 1:
                observe_many(self.itl, 0.0, n - 1)
            self._generate(n)

        def finish(r: SimRequest) -> None:
            self.e2e.observe(time.monotonic() - r.taken)

        return StepStats(on_admit=admit, on_first=first, on_tokens=tokens, on_finish=finish)

    def _generate(self, n: int = 1) -> None:
        self.generation.inc(n)
        self._generated += n

    def render(self, engine: SimEngine) -> bytes:
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv.set(engine.pool.usage())
        self.kv_used.set(engine.pool.used * engine.profile.block_size)
        now, generated = time.monotonic(), self._generated
        t0, g0 = self._last_gen
        if now - t0 > 0.5:
            self.gen_throughput.set((generated - g0) / (now - t0))
            self._last_gen = (now, generated)
        text = generate_latest(self.registry)
        return b"\n".join(line for line in text.split(b"\n") if b"_created" not in line)
