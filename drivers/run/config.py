"""What the user asked for: one run's configuration, and the errors that stop it before it starts."""

from __future__ import annotations

import os
import re
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from rampwatch.drivers.client.request_options import HeaderTemplate, fixed_headers, merge_headers
from rampwatch.drivers.client.streamer import TurnOptions
from rampwatch.drivers.model.events import ENDPOINT_ROLES, Endpoint, endpoint_name
from rampwatch.drivers.net.wire import url_credentials
from rampwatch.drivers.telemetry.metrics import redact_url
from rampwatch.drivers.telemetry.prometheus import Match


class BadInput(Exception):
    """Something the user asked for cannot work; one line, exit code 2."""


@dataclass(frozen=True)
class TraceOptions:
    """--trace and its flags (drivers/run/trace_run.py replays it)."""

    path: str
    format: str = "auto"
    block_size: int | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    sessions: int | None = None
    max_context: int | None = None
    kv_tokens: int | None = None  # --trace-kv-tokens: the ideal is also computed for an LRU pool this large
    skip_bad: bool = False
    api: str = "completions"  # --trace-api: raw prompts (token-exact sharing), or one chat message each
    timing: str = "session"  # --trace-timing: a turn after its previous reply plus the trace's gap, or at its time
    speed: float = 1.0  # --trace-speed: the trace's times divided by this
    warm: bool = False  # --trace-warm: the prompts' salt is the trace's own, so a second run hits the first's cache


@dataclass
class RunConfig:
    """Everything one run needs to know, from the command line; sent to the
    driver process as JSON (the API key travels this way, never in argv)."""

    url: str  # the first (or only) server sessions are sent to
    mode: Literal["run", "watch", "demo"] = "run"
    more_urls: list[str] = field(default_factory=list)  # further servers: sessions are spread round-robin
    pins: dict[str, str] = field(default_factory=dict)  # session id -> one of the servers (URL or name)
    model: str | None = None
    sessions: int = 1
    stagger: float = 0.0
    schedule: list[int] = field(default_factory=list)
    output_tokens: int = 128
    max_tokens: int | None = None  # caps reasoning + answer; None: each request asks output_tokens
    time_scale: float | None = None  # demo: the simulated engine's speed-up (the Header's, see events.py)
    reasoning: str = "auto"  # off | on | auto: the thinking switches sent in extra_body (auto: none)
    ignore_eos: bool = False
    metrics_urls: list[str] = field(default_factory=list)  # [ROLE:][NAME=]URL each; default URL/metrics per server
    gpu: str | list[str] = "auto"  # auto | none | dcgm-exporter URLs (one per node)
    scrape_interval: float = 0.5
    record: Path | None = None
    api_key: str | None = None  # the inference servers' key: sent to them alone, never to a metrics or GPU URL
    metrics_token: str | None = None  # --metrics-auth-env's Bearer token for metrics and GPU URLs
    retries: int = 0
    request_timeout: float = 3600.0
    reconnect_timeout: float = 180.0
    command: list[str] = field(default_factory=list)
    record_text: bool = False  # keep prompt and reply text in the recording (large, maybe private)
    concurrency: int | None = None  # sessions in flight at once (None: all); the peer benchmark adapter uses it
    lockstep: bool = False  # a barrier per turn: turn k+1 starts when turn k of every live session is done
    one_shot: bool = False  # after the ramp, one fresh prompt as long as its last turn (a baseline)
    strict_needle: bool = False  # replies re-sent with the needle's code masked: the only copy stays in turn 1
    time_limit: float | None = None  # seconds after which no new turn starts
    grace: float = 0.0  # seconds a turn in flight at the time limit may go on (0: it finishes)
    ca_bundle: Path | None = None  # trust these certificates instead of certifi's bundle
    insecure: bool = False  # verify no certificate (said loudly: header, recording, output)
    prometheus: str | None = None  # read server and GPU figures from this Prometheus server instead of scraping
    prometheus_match: list[Match] = field(default_factory=list)  # which engines it reads, with their roles (none: all)
    prometheus_gpu_match: str = ""  # which GPUs it reads (PromQL label matchers; empty: all)
    serve_metrics: str | None = None  # [HOST:]PORT: expose rampwatch's own figures for Prometheus
    otlp: str | None = None  # [HOST:]PORT: receive the engine's OTLP/HTTP trace spans (drivers/telemetry/otlp.py)
    extra_body: dict[str, Any] = field(default_factory=dict)  # request options merged into every chat request
    request_headers: list[HeaderTemplate] = field(default_factory=list)  # --header: to the inference servers only
    system_prompt: str | None = None  # --system-prompt: the system message every session opens with
    shared_prefix: int = 0  # --shared-prefix: tokens every session shares after it, before its own salt
    corpus: Path | None = None  # --corpus: new text is read from these files instead of pseudo-words
    think_time: tuple[float, float] | None = None  # --think-time: the user's pause before each later turn (s)
    arrivals_per_s: float | None = None  # --arrivals: open loop, `sessions` conversations arrive at this Poisson rate
    seed: int | None = None  # --seed: draws the arrival times (None: one is drawn and recorded)
    max_live: int | None = None  # --max-live: conversations live at once in an open loop (None: no cap)
    slo: str | None = None  # --slo as given (checked by drivers/model/slo.parse_slo)
    warmup: str | None = None  # --warmup as given (checked by drivers/model/slo.parse_warmup)
    # --trace: the sessions, their turns, sizes and due times come from this trace (drivers/run/trace_run.py)
    trace: TraceOptions | None = None
    workers: int = 1  # --workers: driver processes running the sessions behind this one (1: this one runs them)
    cluster: str | None = None  # --cluster ray[://HOST:PORT]: the workers are Ray actors over the cluster's nodes
    workers_per_node: int = 1  # --workers-per-node: with --cluster, actors on each node
    workers_restart: bool = False  # --workers-restart: a lost worker's sessions go on, on a new one
    shard: tuple[int, int] | None = None  # --shard I/N: run only shard I of N of a seeded run (drivers/run/shards.py)
    start_at: float | None = None  # --start-at: Unix seconds at which the run's sessions start (shards agree on it)
    salt_tag: str = ""  # with --seed, mixed into the prompts' salt: a sweep's point label, so points share no cache

    @property
    def base_url(self) -> str:
        """The server URL without credentials (those travel in headers())."""
        return base_of(self.url)

    @property
    def base_urls(self) -> list[str]:
        """Every server sessions are sent to, without credentials."""
        return [base_of(u) for u in (self.url, *self.more_urls)]

    def prometheus_engines(self) -> list[Match] | None:
        """What engines are read from Prometheus with; None: --metrics-url scrapes them (never both:
        one engine read twice would count its tokens twice in the totals)."""
        return None if self.metrics_urls else self.prometheus_match or [Match()]

    def prometheus_gpus(self) -> str | None:
        """The label matchers GPUs are read from Prometheus with; None: --gpu names the GPU sources."""
        return None if self.gpu_sources() else self.prometheus_gpu_match

    def gpu_sources(self) -> list[str]:
        return [self.gpu] if isinstance(self.gpu, str) else list(self.gpu)  # empty: --prometheus reads the GPUs

    def metrics_sources(self) -> list[MetricsSource]:
        """What to scrape: the --metrics-url specs, else each server's /metrics (none: --prometheus reads them)."""
        if self.metrics_urls or self.prometheus:
            return [parse_metrics_spec(s) for s in self.metrics_urls]
        return [MetricsSource(endpoint_name(u), "both", u + "/metrics") for u in self.base_urls]

    def endpoints(self) -> list[Endpoint]:
        """Every server by name: those sessions go to, each with the metrics
        source of the same name (if any), then the metrics-only sources."""
        sources = {s.name: s for s in self.metrics_sources()}
        out = []
        for url in self.base_urls:
            name = endpoint_name(url)
            src = sources.pop(name, None)
            out.append(
                Endpoint(
                    name=name, role=src.role if src else "both", url=url, metrics=redact_url(src.url) if src else ""
                )
            )
        out += [Endpoint(name=s.name, role=s.role, metrics=redact_url(s.url)) for s in sources.values()]  # type: ignore[arg-type]
        return out

    def target_for(self, session: str, k: int) -> str:
        """The base URL session `session` (the k-th, 1-based) sends its turns to:
        its --pin, else round-robin over the servers."""
        urls = self.base_urls
        pin = self.pins.get(session)
        if pin is not None:
            return next(u for u in urls if pinned_to(pin, u))
        return urls[(k - 1) % len(urls)]

    def headers(self) -> dict[str, str]:
        """Every request to the inference servers carries these: the API key as Bearer, else user:password@
        from the URL as Basic, then the --header values without placeholders (so one of them may replace
        the Authorization)."""
        return merge_headers(self._authorization(), fixed_headers(self.request_headers))

    def _authorization(self) -> dict[str, str]:
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key}"}
        return url_credentials(self.url)

    def metrics_headers(self) -> dict[str, str]:
        """Authorization for metrics and GPU URLs, which may be other hosts than the inference servers: only
        --metrics-auth-env's token (a URL's own user:password@ goes as Basic instead, for that URL alone),
        never the API key."""
        return {"Authorization": f"Bearer {self.metrics_token}"} if self.metrics_token else {}

    def turn_options(self, model: str, run_id: str) -> TurnOptions:
        """What every session's turns are sent with."""
        return TurnOptions(
            model=model,
            output_tokens=self.output_tokens,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            retries=self.retries,
            reconnect_timeout=self.reconnect_timeout,
            record_text=self.record_text,
            request_timeout=self.request_timeout,
            strict_needle=self.strict_needle,
            extra_body=self.extra_body,
            header_templates=tuple(h for h in self.request_headers if h.per_request),
            run_id=run_id,
            think_time=self.think_time,
            time_scale=self.time_scale or 1.0,
        )


def base_of(url: str) -> str:
    return redact_url(url.rstrip("/").removesuffix("/v1"))


def pinned_to(pin: str, url: str) -> bool:
    """Whether a --pin target (a URL in any spelling, or a name) is the server at base URL `url`."""
    return pin == endpoint_name(url) or base_of(pin) == url


@dataclass(frozen=True)
class MetricsSource:
    name: str
    role: str  # prefill | decode | both
    url: str  # may carry user:password@ (sent as a Basic Authorization header, never displayed)


def parse_metrics_spec(spec: str) -> MetricsSource:
    """'[ROLE:][NAME=]URL' -> MetricsSource; BadInput when it is not one."""
    role, rest = "both", spec.strip()
    head, colon, tail = rest.partition(":")
    if colon and head in ENDPOINT_ROLES and not tail.startswith("//"):
        role, rest = head, tail
    name, eq, url = rest.partition("=")
    if not eq or "://" in name:
        name, url = "", rest
    if not is_http_url(url):
        raise BadInput(
            f"--metrics-url {spec!r}: not a URL (use [prefill:|decode:|both:|router:][NAME=]http://HOST:PORT/metrics)"
        )
    return MetricsSource(name.strip() or endpoint_name(url), role, url)


def is_http_url(url: str) -> bool:
    """An http:// or https:// URL with a host, and a port if any that is one."""
    try:
        u = urlsplit(url)
        u.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname)


def parse_pin(spec: str) -> tuple[str, str]:
    """'s1=URL' or 's1=NAME' -> (session, target)."""
    session, eq, target = spec.partition("=")
    if not eq or not session.strip() or not target.strip():
        raise BadInput(f"--pin {spec!r}: use SESSION=URL or SESSION=NAME, e.g. s1=http://10.0.0.2:8000")
    return session.strip(), target.strip()


def check_topology(cfg: RunConfig) -> None:
    """Bad input in the servers, pins and metrics sources, found before any traffic."""
    urls = cfg.base_urls
    if len(set(urls)) < len(urls):
        raise BadInput("the same server URL is given twice")
    names = [endpoint_name(u) for u in urls]
    sources = cfg.metrics_sources()
    if len({s.name for s in sources}) < len(sources):
        raise BadInput("two --metrics-url sources have the same name; name them: --metrics-url NAME=URL")
    ids = {f"s{k + 1}" for k in range(cfg.sessions)} | {"one-shot"}
    for session, target in cfg.pins.items():
        if session not in ids:
            raise BadInput(f"--pin {session}=…: no such session (sessions are s1..s{cfg.sessions})")
        if not any(pinned_to(target, u) for u in urls):
            raise BadInput(f"--pin {session}={target}: not one of the servers ({', '.join(names)})")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def parse_duration(text: str, zero: bool = False) -> float:
    """'40s', '90m', '2h', '1h30m' or plain seconds ('90') -> seconds; BadInput otherwise (and for zero,
    unless `zero`: a pause may be none at all, a time limit may not)."""
    s = text.strip().lower()
    parts = _DURATION.findall(s)
    if not s or "".join(n + u for n, u in parts) != s or any(u == "" for _, u in parts[:-1]):
        raise BadInput(f"not a duration: {text!r} (use e.g. 40s, 90m, 2h or 1h30m)")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0 and not (zero and seconds == 0):
        raise BadInput(f"a duration must be longer than zero: {text!r}")
    return seconds


def proxy_for(url: str) -> str | None:
    """The proxy that HTTP(S)_PROXY / ALL_PROXY would send `url` through (NO_PROXY honoured), or None."""
    proxies = urllib.request.getproxies_environment()
    u = urlsplit(url)
    proxy = proxies.get(u.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(u.hostname or "", proxies):
        return None
    return redact_url(proxy)


def check_direct(cfg: RunConfig) -> None:
    """rampwatch connects directly (its streaming client has no proxy support, and
    its probes must take the same route), so a URL the proxy variables would
    route elsewhere is bad input, said in one line with the fix."""
    urls = [
        *cfg.base_urls,
        *(s.url for s in cfg.metrics_sources()),
        *(g for g in cfg.gpu_sources() if "://" in g),
        *([cfg.prometheus] if cfg.prometheus else []),
    ]
    for url in urls:
        proxy = proxy_for(url)
        if proxy is not None:
            host = urlsplit(url).hostname
            raise BadInput(
                f"{redact_url(url)} would go through the proxy {proxy} (HTTP_PROXY/HTTPS_PROXY/ALL_PROXY); "
                f"rampwatch connects directly: add {host} to NO_PROXY, or unset the proxy variables"
            )


def default_record_path(model: str, folder: Path = Path("recordings")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.split("/")[-1])[:40]
    return folder / f"{stamp}-{safe}.jsonl"


def load_metrics_token(env_var: str | None) -> str | None:
    """--metrics-auth-env VAR's value: the Bearer token for metrics and GPU URLs (never printed or recorded)."""
    if not env_var:
        return None
    token = os.environ.get(env_var)
    if not token:
        raise BadInput(f"--metrics-auth-env {env_var}: the variable is not set")
    return token


def load_api_key(env_var: str | None, key_file: str | None) -> str | None:
    """The API key from --api-key-file, --api-key-env, or OPENAI_API_KEY. It is
    only ever put in request headers: never printed, logged or recorded."""
    if key_file:
        try:
            lines = Path(key_file).read_text().splitlines()
            key = lines[0].strip() if lines else ""  # the first line: a trailing newline or a comment below is fine
        except OSError as e:
            raise BadInput(f"--api-key-file {key_file}: {e.strerror or e}") from None
        if not key:
            raise BadInput(f"--api-key-file {key_file}: the file is empty")
        return key
    if env_var:
        key = os.environ.get(env_var)
        if not key:
            raise BadInput(f"--api-key-env {env_var}: the variable is not set")
        return key
    return os.environ.get("OPENAI_API_KEY") or None
