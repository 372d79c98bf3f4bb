"""Server and GPU figures read from a Prometheus server (`--prometheus URL`),
for a fleet rampwatch cannot or should not scrape itself.

Each interval two instant queries go to its HTTP API, one for the engines'
series (vllm:, sglang:, llamacpp:) and one for dcgm-exporter's (DCGM_FI_DEV_).
The answer is grouped by `instance`, rebuilt into exposition text and read by
the same code as a direct scrape, so the panels and the recording's events
are the same: one endpoint per engine instance, GPUs labelled by node.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.telemetry.gpu import parse_dcgm
from rampwatch.drivers.telemetry.metrics import MetricsFormatError, detect, normalize, redact_url

ENGINE_QUERY = '{__name__=~"vllm:.+|sglang:.+|llamacpp:.+"}'
GPU_QUERY = '{__name__=~"DCGM_FI_DEV_.+"}'


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


class PrometheusReader:
    """Polls a Prometheus server and emits MetricsSample per engine instance and
    GpuSample per GPU instance; a failing query becomes MetricsError /
    GpuUnavailable for source 'prometheus', never an exception in the run."""

    def __init__(self, url: str, interval: float, emit: Callable[[ev.AnyEvent], None], clock: Callable[[], float],
                 headers: dict[str, str] | None = None, verify: ssl.SSLContext | bool = True, gpus: bool = True):
        self.url, self.interval, self.emit, self.clock, self.gpus = url.rstrip("/"), interval, emit, clock, gpus
        self.source = "prometheus " + redact_url(self.url)
        self._client = httpx.AsyncClient(timeout=max(2.0, 5 * interval), headers=headers or {}, trust_env=False,
                                         verify=verify)

    async def query(self, promql: str) -> list[dict[str, Any]]:
        r = await self._client.get(self.url + "/api/v1/query", params={"query": promql})
        if r.status_code != 200:
            raise MetricsFormatError(f"HTTP {r.status_code} from the Prometheus API")
        try:
            data = r.json()
            if data.get("status") != "success" or data["data"]["resultType"] != "vector":
                raise MetricsFormatError(f"query failed: {data.get('error', data.get('status'))}")
            return list(data["data"]["result"])
        except (ValueError, KeyError, TypeError) as e:
            raise MetricsFormatError(f"not a Prometheus API answer ({type(e).__name__})") from None

    async def scrape_once(self) -> None:
        try:
            engines = await self.query(ENGINE_QUERY)
        except (httpx.HTTPError, MetricsFormatError) as e:
            self.emit(ev.MetricsError(t=self.clock(), source=self.source, error=_describe(e)))
        else:
            t = self.clock()
            for instance, series in sorted(by_instance(engines).items()):
                text = exposition(series)
                engine, values, missing = normalize(text, detect(text))
                self.emit(ev.MetricsSample(t=t, source=instance, engine=engine, values=values, missing=missing))
        if not self.gpus:
            return
        try:
            gpus = await self.query(GPU_QUERY)
        except (httpx.HTTPError, MetricsFormatError) as e:
            self.emit(ev.GpuUnavailable(t=self.clock(), source=self.source, reason=f"Prometheus: {_describe(e)}"))
            return
        t = self.clock()
        if not gpus:
            self.emit(ev.GpuUnavailable(t=t, source=self.source, reason="no DCGM_FI_DEV_* series in Prometheus"))
        for instance, series in sorted(by_instance(gpus).items()):
            host = urlsplit("//" + instance).hostname or instance
            self.emit(ev.GpuSample(t=t, source=f"prometheus {instance}", gpus=parse_dcgm(exposition(series), node=host)))

    async def run(self) -> None:
        """Read until cancelled; the owner then calls aclose()."""
        while True:
            await self.scrape_once()
            await asyncio.sleep(self.interval)

    async def aclose(self) -> None:
        await self._client.aclose()


def _describe(e: Exception) -> str:
    if isinstance(e, httpx.ConnectError):
        return "cannot connect to Prometheus"
    if isinstance(e, httpx.TimeoutException):
        return "Prometheus timed out"
    return str(e) or type(e).__name__
