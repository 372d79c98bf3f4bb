"""Prometheus /metrics scraping, normalized through per-engine profiles.

A profile maps rampwatch's field names to each engine's series (with the
renamed aliases of older releases). A field the server does not expose is
left out and explained in `missing`, never reported as 0.

Parsing is a one-regex line scan that looks only at the series a profile
names: several times faster than the stock parser, which matters because it
shares the event loop that stamps token arrivals.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.endpoints import ENGINE_POOL
from rampwatch.drivers.net.tls import tls_context
from rampwatch.drivers.net.wire import Connection, ConnectionDropped, ConnectionFailed, url_credentials

# One sample line of the Prometheus text format: name, {labels} and value (the DCGM reader parses with it too).
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", re.M)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# How each field combines across label sets (engines, dp ranks): counters and
# request gauges add up; fractions take the max (summing them is meaningless).
MAX_FIELDS = {"kv_usage"}


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple[tuple[str, str], ...] = ()  # required label values


@dataclass(frozen=True)
class Profile:
    engine: str
    prefix: str
    fields: dict[str, tuple[Series, ...]]  # first alias with samples wins
    why_missing: dict[str, str] = field(default_factory=dict)
    # Label sets that repeat one batch (SGLang tensor-parallel ranks): keep rank 0 only.
    dedupe_label: str | None = None
    # A router's requests per worker, one sample per worker label (None: not a router).
    worker_series: str | None = None


def _s(*names: str, **labels: str) -> tuple[Series, ...]:
    return tuple(Series(n, tuple(sorted(labels.items()))) for n in names)


def SPEC_FIELDS(prefix: str) -> dict[str, tuple[Series, ...]]:  # noqa: N802 (reads as the table it fills)
    """Speculative decoding's draft tokens accepted and proposed (vLLM and llama.cpp share the names). Only a server
    that speculates has them: they are not in FIELDS, so a server without is not told it lacks them."""
    return {
        "spec_accepted": _s(prefix + "spec_decode_num_accepted_tokens_total"),
        "spec_drafted": _s(prefix + "spec_decode_num_draft_tokens_total"),
    }


VLLM = Profile(
    engine="vllm",
    prefix="vllm:",
    fields={
        "kv_usage": _s("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "running": _s("vllm:num_requests_running"),
        "waiting": _s("vllm:num_requests_waiting"),
        "prefix_queries": _s("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_hits": _s("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "prompt_tokens": _s("vllm:prompt_tokens_total"),
        "prompt_computed": _s("vllm:prompt_tokens_by_source_total", source="local_compute"),
        # KV a connector brought in (a split's decode side): counted in usage's cached_tokens, not a cache hit.
        "kv_transferred": _s("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        + _s("vllm:external_prefix_cache_hits_total"),
        "generation_tokens": _s("vllm:generation_tokens_total"),
        "preemptions": _s("vllm:num_preemptions_total"),
        "ttft_sum": _s("vllm:time_to_first_token_seconds_sum"),
        "ttft_count": _s("vllm:time_to_first_token_seconds_count"),
        # Requests finished (every finished_reason): which backend served a turn (drivers/model/backends.py).
        "requests": _s("vllm:request_success_total"),
        **SPEC_FIELDS("vllm:"),
    },
    why_missing={
        "prefix_queries": "prefix caching off or metric not exposed (--enable-prefix-caching)",
        "prefix_hits": "prefix caching off or metric not exposed (--enable-prefix-caching)",
        "prompt_computed": "needs vLLM >= 0.11 (prompt_tokens_by_source)",
        "kv_capacity_tokens": "no vllm:cache_config_info on this server",
    },
)

SGLANG = Profile(
    engine="sglang",
    prefix="sglang:",
    fields={
        "kv_usage": _s("sglang:token_usage"),
        "running": _s("sglang:num_running_reqs"),
        "waiting": _s("sglang:num_queue_reqs"),
        "prefix_queries": _s("sglang:prompt_tokens_total"),
        "prefix_hits": _s("sglang:cached_tokens_total"),
        "prompt_tokens": _s("sglang:prompt_tokens_total"),
        "prompt_computed": _s("sglang:realtime_tokens_total", mode="prefill_compute"),
        "generation_tokens": _s("sglang:generation_tokens_total"),
        "kv_capacity_tokens": _s("sglang:max_total_num_tokens"),
        "ttft_sum": _s("sglang:time_to_first_token_seconds_sum"),
        "ttft_count": _s("sglang:time_to_first_token_seconds_count"),
    },
    why_missing={
        "prefix_hits": "SGLang exposes no prefix-cache counters (sglang:cached_tokens_total needs a newer release)",
        "preemptions": "SGLang exposes no preemption counter",
        "kv_capacity_tokens": "SGLang exposes max_total_num_tokens only in newer releases",
    },
    dedupe_label="tp_rank",
)

LLAMACPP = Profile(
    engine="llama.cpp",
    prefix="llamacpp:",
    fields={
        "running": _s("llamacpp:requests_processing"),
        "waiting": _s("llamacpp:requests_deferred"),
        "prompt_computed": _s("llamacpp:prompt_tokens_total"),
        "prefix_hits": _s("llamacpp:prompt_tokens_cached_total"),
        "generation_tokens": _s("llamacpp:tokens_predicted_total"),
        **SPEC_FIELDS("llamacpp:"),
    },
    why_missing={
        "kv_usage": "llama.cpp exposes no KV-cache occupancy (see /slots)",
        "kv_capacity_tokens": "llama.cpp exposes no KV pool size",
        "prefix_hits": "needs a llama.cpp build with prompt_tokens_cached_total",
        "prefix_queries": "needs a llama.cpp build with prompt_tokens_cached_total",
        "preemptions": "llama.cpp does not preempt",
        "ttft_sum": "llama.cpp has no TTFT histogram",
        "ttft_count": "llama.cpp has no TTFT histogram",
    },
)


# The routers (ENGINES.md §1.11): no model figures, their requests in all; requests per worker come beside
# (router_workers), since they are one figure a worker. vllm-router began as a fork of SGLang's older router
# (sgl-router, sgl-router/src/metrics.rs): the same series under its own prefix.
def _forked_router(engine: str, prefix: str) -> Profile:
    """sgl-router's series under `prefix`: requests by route, retries, errors, and each worker's requests."""
    return Profile(
        engine=engine,
        prefix=prefix,
        fields={
            "router_requests": _s(f"{prefix}requests_total"),
            "router_retries": _s(f"{prefix}retries_total"),
            "router_errors": _s(f"{prefix}request_errors_total"),
        },
        worker_series=f"{prefix}processed_requests_total",
    )


VLLM_ROUTER = _forked_router("vllm-router", "vllm_router_")
# SGLang's model gateway, as `pip install sglang-router` (0.3.2, read live here) serves it: its own smg_ names; its
# selections carry no worker label, so a worker's requests are its circuit breaker's outcomes (success + failure).
SGLANG_ROUTER = Profile(
    engine="sglang-router",
    prefix="smg_",
    fields={
        "router_requests": _s("smg_router_requests_total"),
        "router_retries": _s("smg_worker_retries_total"),
        "router_errors": _s("smg_router_request_errors_total"),
    },
    worker_series="smg_worker_cb_outcomes_total",
)
# SGLang's older router (sgl-router, before the gateway took the smg_ names).
SGL_ROUTER = _forked_router("sgl-router", "sgl_router_")
ROUTERS = (VLLM_ROUTER, SGLANG_ROUTER, SGL_ROUTER)  # their engine names are the model's ROUTER_ENGINES (endpoints.py)

PROFILES = (VLLM, SGLANG, LLAMACPP)  # the model servers' (what --prometheus asks for)
DETECTED = (*PROFILES, *ROUTERS)  # what a scrape may find
FIELDS = (
    "kv_usage",
    "running",
    "waiting",
    "prefix_queries",
    "prefix_hits",
    "prompt_tokens",
    "prompt_computed",
    "generation_tokens",
    "preemptions",
    "kv_capacity_tokens",
    "ttft_sum",
    "ttft_count",
)


class MetricsFormatError(ValueError):
    """The text is not a Prometheus exposition rampwatch can read."""


def parse_labels(text: str | None) -> dict[str, str]:
    """The labels inside a sample line's braces, as a dict."""
    return dict(_LABEL.findall(text)) if text else {}


def _number(text: str) -> float:
    return float(text)  # handles +Inf, NaN and exponents


def _sample_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and line[0] != "#")


def detect(text: str) -> Profile | None:
    counts = {p.engine: text.count("\n" + p.prefix) + text.startswith(p.prefix) for p in DETECTED}
    best = max(DETECTED, key=lambda p: counts[p.engine])
    return best if counts[best.engine] else None


def router_workers(text: str, profile: Profile = VLLM_ROUTER) -> dict[str, float]:
    """A router's requests per worker: its processed_requests_total{worker}, summed per worker label."""
    out: dict[str, float] = {}
    for m in SAMPLE_LINE.finditer(text):
        if m.group(1) == profile.worker_series:
            worker = parse_labels(m.group(2)).get("worker", "")
            try:
                out[worker] = out.get(worker, 0.0) + _number(m.group(3))
            except ValueError:
                raise MetricsFormatError(f"bad sample value in line: {m.group(0)[:120]}") from None
    return out


def normalize(text: str, profile: Profile | None = None) -> tuple[str, dict[str, float], dict[str, str]]:
    """(engine, values, missing) from one /metrics text."""
    profile = profile or detect(text)
    if profile is None:
        if not SAMPLE_LINE.search(text):
            raise MetricsFormatError("not a Prometheus text exposition")
        reason = "no vllm:, sglang: or llamacpp: series (vLLM with --disable-log-stats exposes none)"
        return "unknown", {}, {f: reason for f in FIELDS}
    wanted: dict[str, list[tuple[str, Series]]] = {}
    for fname, aliases in profile.fields.items():
        for s in aliases:
            wanted.setdefault(s.name, []).append((fname, s))
    found: dict[tuple[str, Series], float] = {}
    config_capacity = engine_capacity = 0.0  # all engines' (data-parallel ranks') pools, and the largest one's
    parsed = 0
    for m in SAMPLE_LINE.finditer(text):
        parsed += 1
        name = m.group(1)
        if name == "vllm:cache_config_info":
            lab = parse_labels(m.group(2))
            size = lab.get("kv_cache_size_tokens")
            try:
                one = (
                    float(size)
                    if size not in (None, "", "None")
                    else float(lab["num_gpu_blocks"]) * float(lab["block_size"])
                )
            except (KeyError, ValueError):
                continue
            config_capacity += one
            engine_capacity = max(engine_capacity, one)
            continue
        targets = wanted.get(name)
        if not targets:
            continue
        lab = parse_labels(m.group(2))
        if profile.dedupe_label and lab.get(profile.dedupe_label, "0") != "0":
            continue
        try:
            value = _number(m.group(3))
        except ValueError:
            raise MetricsFormatError(f"bad sample value in line: {m.group(0)[:120]}") from None
        for fname, s in targets:
            if any(lab.get(k) != v for k, v in s.labels):
                continue
            key = (fname, s)
            if fname in MAX_FIELDS:
                found[key] = max(found.get(key, value), value)
            else:
                found[key] = found.get(key, 0.0) + value
    if parsed < _sample_lines(text):
        bad = next(
            line for line in text.splitlines() if line.strip() and line[0] != "#" and not SAMPLE_LINE.match(line)
        )
        raise MetricsFormatError(f"malformed exposition, e.g. {bad.strip()[:80]!r}")
    values: dict[str, float] = {}
    for fname, aliases in profile.fields.items():
        for s in aliases:
            if (fname, s) in found:
                values[fname] = found[(fname, s)]
                break
    if config_capacity > 0:
        values["kv_capacity_tokens"] = config_capacity
        values[ENGINE_POOL] = engine_capacity
    elif "kv_capacity_tokens" in values:  # SGLang: one engine's pool (tensor-parallel ranks deduplicated)
        values[ENGINE_POOL] = values["kv_capacity_tokens"]
    if profile is LLAMACPP and "prefix_hits" in values and "prompt_computed" in values:
        # llama.cpp's prompt counter excludes cache hits; queries are both together.
        values["prefix_queries"] = values["prompt_tokens"] = values["prompt_computed"] + values["prefix_hits"]
    if profile.worker_series is not None:  # a router serves no model: none of the engine figures is its to lack
        return profile.engine, values, {}
    missing = {
        f: profile.why_missing.get(f, f"not exposed by this {profile.engine} server") for f in FIELDS if f not in values
    }
    return profile.engine, values, missing


HTTP_HINTS = {
    401: "it wants credentials: --metrics-auth-env VAR (a Bearer token) or user:password@ in its URL",
    403: "it refused the credentials (--metrics-auth-env VAR, or user:password@ in its URL)",
    404: "no /metrics here (SGLang needs --enable-metrics)",
    501: "metrics disabled (llama.cpp needs --metrics)",
}


class MetricsScraper:
    """Scrapes one URL on an interval and emits MetricsSample / MetricsError,
    backing off while it fails; it never raises into the run."""

    MAX_BACKOFF = 30.0
    FINAL_WAIT_S = 2.0  # the run's last read: a server slower than this says nothing after the run's last event

    def __init__(
        self,
        url: str,
        interval: float,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        headers: dict[str, str] | None = None,
        verify: ssl.SSLContext | bool = True,
        source: str | None = None,
    ):
        self.url, self.interval, self.emit, self.clock = url, interval, emit, clock
        self.source = source or redact_url(url)  # the endpoint's name in events
        # A scrape slower than a few intervals is stale by the time it lands.
        self.timeout = max(2.0, 5 * interval)
        # Scrapes share the loop that stamps the streams: one keep-alive connection of the driver's own lean
        # client (net/wire.py), not httpx, which spent ~2.5 ms of CPU on one scrape here, in one pass of it.
        u = urlsplit(url)
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._headers = {**(headers or {}), **url_credentials(url)}  # the URL's own, as httpx sent them
        # The run's TLS context; True: the default one, made when an https connection opens.
        tls = verify if isinstance(verify, ssl.SSLContext) else None if verify else tls_context(insecure=True)
        host = u.netloc.rpartition("@")[2]  # the credentials go as a header; an IPv6 literal keeps its brackets
        # Its reads' times go unused: a plain clock keeps them out of the client check (wire.read_stamp).
        self._conn = Connection(f"{u.scheme}://{host}", time.perf_counter, connect_timeout=self.timeout, tls=tls)
        self._profile: Profile | None = None
        self._llama_ctx: float | None = None  # llama.cpp's context (all slots), from /props: its KV size in tokens
        self._llama_asked = False  # /props is asked once (a server without it is not asked every scrape)
        self.read_once = asyncio.Event()  # set once its first scrape is in, answered or failed

    async def _get(self, path: str) -> tuple[int, bytes]:
        return await self._conn.get(path, self._headers, self.timeout)

    async def _llama_context(self) -> float | None:
        """llama.cpp keeps its context size out of /metrics; /props has it (per slot, and the slots)."""
        if not self._llama_asked:
            self._llama_asked = True
            try:
                status, body = await self._get(re.sub(r"/metrics(?=$|\?)", "/props", self._path, count=1))
                props = json.loads(body) if status == 200 else {}
                per_slot = props["default_generation_settings"]["n_ctx"]
                self._llama_ctx = float(per_slot) * float(props.get("total_slots") or 1)
            except (*FETCH_ERRORS, KeyError, TypeError):  # JSON that is not llama.cpp's /props: ValueError
                pass
        return self._llama_ctx

    async def scrape_once(self) -> bool:
        try:
            asked_t = self.clock()
            status, body = await self._get(self._path)
            t = self.clock()
            if status != 200:
                hint = HTTP_HINTS.get(status, "")
                raise MetricsFormatError(f"HTTP {status}" + (f": {hint}" if hint else ""))
            text = body.decode(errors="replace")  # as httpx read it: a stray byte spoils one label, not the scrape
            if self._profile is None or self._profile.prefix not in text:
                self._profile = detect(text)  # (re)detect after an engine restart
            engine, values, missing = normalize(text, self._profile)
            if engine == "llama.cpp" and (ctx := await self._llama_context()) is not None:
                values["kv_capacity_tokens"] = ctx
                missing.pop("kv_capacity_tokens", None)
            router = self._profile is not None and self._profile.worker_series is not None
            workers = router_workers(text, self._profile) if router else {}
            self.emit(
                ev.MetricsSample(
                    t=t,
                    source=self.source,
                    engine=engine,
                    values=values,
                    missing=missing,
                    workers=workers,
                    asked_t=asked_t,
                )
            )
            return True
        except (*FETCH_ERRORS, MetricsFormatError) as e:
            self.emit(ev.MetricsError(t=self.clock(), source=self.source, error=describe_error(e)))
            return False

    async def final_read(self) -> None:
        """The run's last read, after its last turn."""
        await self.scrape_once()

    async def run(self) -> None:
        """Scrape until cancelled; the owner then calls aclose() (after final_read, if it wants one)."""
        delay = self.interval
        while True:
            ok = await self.scrape_once()
            self.read_once.set()
            delay = self.interval if ok else min(self.MAX_BACKOFF, max(delay * 2, self.interval))
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        self._conn.close()


# What a failed scrape raises (the lean client's errors; ValueError: not an HTTP response).
FETCH_ERRORS = (ConnectionFailed, ConnectionDropped, asyncio.TimeoutError, OSError, ValueError)


def describe_error(e: Exception) -> str:
    """One short reason for a failed read of a metrics source."""
    if isinstance(e, (httpx.ConnectError, ConnectionFailed)):
        return "cannot connect"
    if isinstance(e, (httpx.TimeoutException, asyncio.TimeoutError)):
        return "timed out"
    return str(e) or type(e).__name__


def redact_url(url: str) -> str:
    """The URL without user:password@ credentials, for display and recordings."""
    return re.sub(r"//[^/@]*@", "//", url)
