"""Server and GPU figures read from a Prometheus server (`--prometheus URL`),
for a fleet rampwatch cannot or should not scrape itself.

Each interval instant queries go to its HTTP API: one per --prometheus-match
for the engines' series (only the vllm:, sglang: and llamacpp: names the
profiles read, so a fleet's histograms are not fetched) and one for
dcgm-exporter's. Each answer is grouped by `instance`, rebuilt into
exposition text and read by the same code as a direct scrape, so the panels
and the recording's events are the same: one endpoint per engine instance
(with the role of the match that found it), GPUs labelled by node.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.telemetry.gpu import DCGM_FIELDS, parse_dcgm
from rampwatch.drivers.telemetry.metrics import (
    PROFILES,
    MetricsFormatError,
    describe_error,
    detect,
    normalize,
    redact_url,
)

ENGINE_SERIES = sorted(
    {s.name for p in PROFILES for aliases in p.fields.values() for s in aliases} | {"vllm:cache_config_info"}
)
# One counter per engine kind, to see when Prometheus last scraped an engine (timestamp() drops the names,
# so series of several names with the same labels cannot be asked at once).
SCRAPE_CLOCK_SERIES = sorted({s.name for p in PROFILES for s in p.fields.get("generation_tokens", ())})

# One PromQL label matcher (job="vllm", instance=~"10\\.0\\..*"); a --prometheus-match is a comma list of them.
_MATCHER = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


@dataclass(frozen=True)
class Match:
    """Which engine series one query reads (PromQL label matchers, empty: all) and the role of what it finds."""

    matchers: str = ""
    role: ev.EndpointRole = "both"


def parse_matchers(text: str) -> str:
    """`job="vllm",instance=~"a.*"` checked and trimmed (braces optional); ValueError says what is wrong."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    rest = body
    while rest.strip():
        m = _MATCHER.match(rest)
        if m is None or (m.end() < len(rest) and rest[m.end()] != ","):
            raise ValueError(
                f'not PromQL label matchers: {text!r} (e.g. job="vllm" or job="vllm",instance=~"10.0.0.*")'
            )
        rest = rest[m.end() + 1 :]
    return body.strip().rstrip(",")


def parse_match(spec: str) -> Match:
    """A --prometheus-match spec: [ROLE:]MATCHERS, e.g. prefill:job="llm-prefill"."""
    role, sep, rest = spec.partition(":")
    if sep and role in ev.ENDPOINT_ROLES:
        return Match(parse_matchers(rest), role)  # type: ignore[arg-type]
    return Match(parse_matchers(spec))


def selector(names: list[str] | tuple[str, ...], matchers: str = "") -> str:
    """An instant-query selector for these metric names, narrowed by label matchers."""
    return '{__name__=~"' + "|".join(names) + '"' + (f",{matchers}" if matchers else "") + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(series: list[dict[str, Any]]) -> str:
    """Instant-query results (one instance's) as Prometheus text lines."""
    lines = []
    for s in series:
        labels = dict(s["metric"])
        name = labels.pop("__name__")
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {s['value'][1]}")
    return "\n".join(lines) + "\n"


def by_instance(result: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in result:
        groups.setdefault(s["metric"].get("instance", "?"), []).append(s)
    return groups


async def instant_query(client: httpx.AsyncClient, url: str, promql: str) -> list[dict[str, Any]]:
    """One instant query's vector; MetricsFormatError says what is wrong with the answer."""
    r = await client.get(url + "/api/v1/query", params={"query": promql})
    try:
        data = r.json()
    except ValueError:
        data = None
    if not isinstance(data, dict) or "status" not in data:
        raise MetricsFormatError(f"HTTP {r.status_code}, not a Prometheus API answer")
    if data["status"] != "success":
        raise MetricsFormatError(f"query failed: {data.get('error', data['status'])}")
    try:
        if data["data"]["resultType"] != "vector":
            raise MetricsFormatError(f"query gave a {data['data']['resultType']}, not a vector")
        return list(data["data"]["result"])
    except (KeyError, TypeError) as e:
        raise MetricsFormatError(f"not a Prometheus API answer ({type(e).__name__})") from None


async def check_prometheus(
    client: httpx.AsyncClient, url: str, matches: list[Match] | None, gpu_matchers: str | None
) -> str | None:
    """Before the run: whether `url` is a Prometheus server that takes every query the run will ask
    (a regex it cannot parse is refused here, not every second). None when it does, else why not."""
    base, shown = url.rstrip("/"), redact_url(url.rstrip("/"))
    queries = [selector(ENGINE_SERIES, m.matchers) for m in matches or []]
    if gpu_matchers is not None:
        queries.append(selector(tuple(DCGM_FIELDS), gpu_matchers))
    try:
        for promql in queries:
            await instant_query(client, base, promql)
    except httpx.HTTPError as e:
        return f"cannot reach Prometheus at {shown}: {type(e).__name__} (is it up?)"
    except MetricsFormatError as e:
        hint = (
            " (give its user:password@ in the --prometheus URL)" if "HTTP 401" in str(e) or "HTTP 403" in str(e) else ""
        )
        return f"Prometheus at {shown}: {e}{hint}"
    return None


class PrometheusReader:
    """Polls a Prometheus server and emits MetricsSample per engine instance and
    GpuSample per GPU instance; a failing query becomes MetricsError /
    GpuUnavailable for source 'prometheus', never an exception in the run.

    Prometheus is its own service: it gets the user:password of its own URL
    (httpx sends them as Basic auth), never the inference server's API key."""

    FINAL_WAIT_S = 30.0  # the longest wait for Prometheus's next scrape of the engines (15 s is a common interval)

    def __init__(
        self,
        url: str,
        interval: float,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        *,
        matches: list[Match] | None,
        gpu_matchers: str | None,
        verify: ssl.SSLContext | bool = True,
    ):
        self.url, self.interval, self.emit, self.clock = url.rstrip("/"), interval, emit, clock
        self.matches = matches  # None: engines are not read from Prometheus
        self.gpu_matchers = gpu_matchers  # None: GPUs are not read from Prometheus
        self.source = "prometheus " + redact_url(self.url)
        self._failing = False
        self.wall = time.time  # Prometheus stamps samples with wall-clock time
        self._client = httpx.AsyncClient(timeout=max(2.0, 5 * interval), trust_env=False, verify=verify)
        self.read_once = asyncio.Event()  # set once its first read is in, answered or failed

    async def query(self, promql: str) -> list[dict[str, Any]]:
        return await instant_query(self._client, self.url, promql)

    async def scrape_once(self) -> None:
        if self.matches is not None:
            await self._read_engines(self.matches)
        if self.gpu_matchers is not None:
            await self._read_gpus(self.gpu_matchers)

    async def _read_engines(self, matches: list[Match]) -> None:
        error = None
        try:
            found = [(m, await self.query(selector(ENGINE_SERIES, m.matchers))) for m in matches]
        except (httpx.HTTPError, MetricsFormatError) as e:
            error = describe_error(e)
        else:
            t = self.clock()
            seen: set[str] = set()
            for match, engines in found:
                for instance, series in sorted(by_instance(engines).items()):
                    if instance in seen:
                        continue  # matched twice: the first match's role holds
                    seen.add(instance)
                    text = exposition(series)
                    engine, values, missing = normalize(text, detect(text))
                    self.emit(
                        ev.MetricsSample(
                            t=t, source=instance, engine=engine, values=values, missing=missing, role=match.role
                        )
                    )
            empty = [m.matchers for m, engines in found if not engines]
            if empty:
                error = "no vllm:, sglang: or llamacpp: series in Prometheus" + (
                    f" matching {'; '.join(empty)}" if any(empty) else ""
                )
        if error is not None or self._failing:
            self.emit(ev.MetricsError(t=self.clock(), source=self.source, error=error or ""))
        self._failing = error is not None

    async def _read_gpus(self, matchers: str) -> None:
        try:
            gpus = await self.query(selector(tuple(DCGM_FIELDS), matchers))
        except (httpx.HTTPError, MetricsFormatError) as e:
            self.emit(ev.GpuUnavailable(t=self.clock(), source=self.source, reason=f"Prometheus: {describe_error(e)}"))
            return
        t = self.clock()
        if not gpus:
            self.emit(
                ev.GpuUnavailable(
                    t=t,
                    source=self.source,
                    reason="no DCGM_FI_DEV_* series in Prometheus" + (f" matching {matchers}" if matchers else ""),
                )
            )
        for instance, series in sorted(by_instance(gpus).items()):
            host = urlsplit("//" + instance).hostname or instance
            self.emit(
                ev.GpuSample(t=t, source=f"prometheus {instance}", gpus=parse_dcgm(exposition(series), node=host))
            )

    async def final_read(self) -> None:
        """The run's last read, once Prometheus has scraped every engine after the run's last turn:
        what it holds lags by up to one scrape interval, and a total must cover the last turns."""
        since = self.wall()
        deadline = time.monotonic() + self.FINAL_WAIT_S - 2.0
        said = False
        while self.matches is not None and time.monotonic() < deadline:
            try:
                stamps = [
                    float(s["value"][1])
                    for m in self.matches
                    for s in await self.query(f"timestamp({selector(SCRAPE_CLOCK_SERIES, m.matchers)})")
                ]
            except (httpx.HTTPError, MetricsFormatError, KeyError, IndexError, TypeError, ValueError):
                break
            if not stamps or min(stamps) >= since:
                break
            if not said:
                said = True
                self.emit(
                    ev.Notice(
                        t=self.clock(),
                        level="info",
                        message=f"waiting up to {self.FINAL_WAIT_S:.0f} s "
                        "for Prometheus's next scrape, so the server totals cover the last turns",
                    )
                )
            await asyncio.sleep(0.25)
        await self.scrape_once()

    async def run(self) -> None:
        """Read until cancelled; the owner then calls aclose()."""
        while True:
            await self.scrape_once()
            self.read_once.set()
            await asyncio.sleep(self.interval)

    async def aclose(self) -> None:
        await self._client.aclose()
