"""Per-GPU load: NVML on this node, or a DCGM exporter's /metrics for a remote one.

Every sampler emits GpuSample or GpuUnavailable and never raises into the
run: a machine without NVML gets a clear 'no GPU source' state.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.telemetry.metrics import SAMPLE_LINE, parse_labels, redact_url


class NvmlReader:
    """Reads all local GPUs through nvidia-ml-py; a field a GPU does not
    support (power on some consumer cards, MIG) is left as None."""

    source = "nvml"

    def __init__(self, nvml: Any = None):
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        self.nvml.nvmlInit()  # raises NVMLError (LibraryNotFound without a driver)
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())]
        self.names = [self._call(self.nvml.nvmlDeviceGetName, h) or "" for h in self.handles]

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) in (self.nvml.NVML_ERROR_GPU_IS_LOST, self.nvml.NVML_ERROR_UNINITIALIZED):
                raise
            return None

    def read(self) -> list[ev.GpuReading]:
        n = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            util = self._call(n.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(n.nvmlDeviceGetMemoryInfo, h)
            power = self._call(n.nvmlDeviceGetPowerUsage, h)
            limit = self._call(n.nvmlDeviceGetEnforcedPowerLimit, h)
            out.append(
                ev.GpuReading(
                    index=i,
                    name=self.names[i],
                    util=float(util.gpu) if util is not None else None,
                    mem_used=float(mem.used) if mem is not None else None,
                    mem_total=float(mem.total) if mem is not None else None,
                    power=power / 1000 if power is not None else None,  # mW -> W
                    power_limit=limit / 1000 if limit is not None else None,
                    sm_clock=_float(self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)),
                    temp=_float(self._call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)),
                )
            )
        return out

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a broken NVML must not fail the run
            pass


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


DCGM_FIELDS = {  # the series read, and their units to NVML's
    "DCGM_FI_DEV_GPU_UTIL": ("util", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used", 1024 * 1024),  # MiB -> bytes
    "DCGM_FI_DEV_FB_FREE": ("_fb_free", 1024 * 1024),
    "DCGM_FI_DEV_FB_RESERVED": ("_fb_reserved", 1024 * 1024),
    "DCGM_FI_DEV_POWER_USAGE": ("power", 1.0),  # W
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp", 1.0),
}


def parse_dcgm(text: str, node: str = "") -> list[ev.GpuReading]:
    """GPU readings from a dcgm-exporter scrape (units converted to NVML's),
    each labelled with its node: the Hostname label, else `node`."""
    gpus: dict[tuple[str, int], dict[str, Any]] = {}
    for m in SAMPLE_LINE.finditer(text):
        spec = DCGM_FIELDS.get(m.group(1))
        if spec is None:
            continue
        lab = parse_labels(m.group(2))
        try:
            idx = int(lab.get("gpu", "0"))
            value = float(m.group(3)) * spec[1]
        except ValueError:
            continue
        host = lab.get("Hostname") or node
        g = gpus.setdefault((host, idx), {"index": idx, "name": lab.get("modelName", ""), "node": host})
        g[spec[0]] = value
    out = []
    for key in sorted(gpus):
        g = gpus[key]
        free, reserved = g.pop("_fb_free", None), g.pop("_fb_reserved", 0.0)
        if free is not None and "mem_used" in g:
            g["mem_total"] = g["mem_used"] + free + reserved
        out.append(ev.GpuReading(**g))
    return out


class GpuSampler:
    """Samples one source on an interval: 'auto' (NVML if present), 'none' or a dcgm-exporter URL."""

    def __init__(
        self,
        source: str,
        interval: float,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        nvml: Any = None,
        verify: ssl.SSLContext | bool = True,
        headers: dict[str, str] | None = None,
    ):
        """`headers`: the metrics sources' authorization (--metrics-auth-env), never the inference API key."""
        self.source, self.interval, self.emit, self.clock = source, interval, emit, clock
        self.verify, self.headers = verify, headers or {}
        self.nvml = nvml  # a pynvml stand-in for tests; None: the real nvidia-ml-py

    async def run(self) -> None:
        if self.source == "none":
            self.emit(ev.GpuUnavailable(t=self.clock(), source="none", reason="GPU sampling off (--gpu none)"))
            return
        if self.source == "auto":
            await self._run_nvml()
        else:
            await self._run_dcgm(self.source)

    async def _run_nvml(self) -> None:
        try:
            # nvmlInit and the device names can take seconds on a busy node: off the event loop, so a slow
            # NVML never delays the sessions' token stamps.
            reader = await asyncio.to_thread(NvmlReader, self.nvml)
        except Exception as e:  # noqa: BLE001 - NVMLError, ImportError, a broken driver
            self.emit(ev.GpuUnavailable(t=self.clock(), source="nvml", reason=f"no GPU source: NVML unavailable ({e})"))
            return
        try:
            while True:
                try:
                    gpus = await asyncio.to_thread(reader.read)
                    self.emit(ev.GpuSample(t=self.clock(), source="nvml", gpus=gpus))
                except Exception as e:  # noqa: BLE001 - a lost GPU degrades this panel only
                    self.emit(ev.GpuUnavailable(t=self.clock(), source="nvml", reason=f"NVML error: {e}"))
                await asyncio.sleep(self.interval)
        finally:
            reader.close()

    async def _run_dcgm(self, url: str) -> None:
        source = redact_url(url)
        async with httpx.AsyncClient(timeout=5.0, trust_env=False, verify=self.verify, headers=self.headers) as client:
            while True:
                try:
                    r = await client.get(url)
                    r.raise_for_status()
                    gpus = parse_dcgm(r.text, node=urlsplit(url).hostname or source)
                    if gpus:
                        self.emit(ev.GpuSample(t=self.clock(), source=source, gpus=gpus))
                    else:
                        self.emit(
                            ev.GpuUnavailable(t=self.clock(), source=source, reason="no DCGM_FI_* series at this URL")
                        )
                except httpx.HTTPError as e:
                    self.emit(
                        ev.GpuUnavailable(
                            t=self.clock(), source=source, reason=f"DCGM exporter: {e or type(e).__name__}"
                        )
                    )
                await asyncio.sleep(self.interval)
