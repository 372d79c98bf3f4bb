"""A simulated dcgm-exporter: the GPUs of one simulated node, whose load
follows the engine's own steps (near full while prefill chunks run, lighter
while it only decodes, idle between requests). Every series is labelled
simulated, so nothing downstream can take it for a real GPU."""

from __future__ import annotations

import time

from rampwatch.drivers.sim.engine import SimEngine

DCGM_PATH = "/dcgm/metrics"  # where a simulated engine serves its node's GPUs
GPU_MODEL = "NVIDIA H200 (simulated)"
FB_TOTAL_MIB = 143_771  # an H200's frame buffer
WEIGHTS_SHARE = 0.45  # of each GPU's memory held by the weights (the rest is KV pool and workspace)
POWER_IDLE_W, POWER_MAX_W = 110.0, 700.0
SM_IDLE_MHZ, SM_BUSY_MHZ = 345.0, 1980.0
PREFILL_UTIL, DECODE_UTIL = 0.97, 0.62  # utilisation while a step of that kind runs


class SimGpus:
    """`count` GPUs on node `node`, rendered in dcgm-exporter's text format."""

    def __init__(self, engine: SimEngine, count: int, node: str):
        self.engine, self.count, self.node = engine, count, node
        self._last = (time.monotonic(), dict(engine.busy))
        self._util = 0.0

    def utilisation(self) -> float:
        """0-1 over the time since the last scrape: the share of it the engine spent stepping, by kind."""
        now, busy = time.monotonic(), dict(self.engine.busy)
        t0, before = self._last
        if now - t0 >= 0.2:  # shorter windows would flicker between a step and its gap
            share = {k: (busy[k] - before[k]) / (now - t0) for k in busy}
            self._util = min(1.0, share["prefill"] * PREFILL_UTIL + share["decode"] * DECODE_UTIL)
            self._last = (now, busy)
        return self._util

    def render(self) -> str:
        util = self.utilisation()
        used_mib = round(FB_TOTAL_MIB * (WEIGHTS_SHARE + (1 - WEIGHTS_SHARE - 0.05) * self.engine.pool.usage()))
        series = {  # every one a gauge: name -> (help, value of GPU k)
            "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", lambda k: round(100 * util * _spread(k), 1)),
            "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", lambda k: used_mib),
            "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", lambda k: FB_TOTAL_MIB - used_mib),
            "DCGM_FI_DEV_POWER_USAGE": (
                "Power draw (in W).",
                lambda k: round(POWER_IDLE_W + (POWER_MAX_W - POWER_IDLE_W) * util * _spread(k), 1),
            ),
            "DCGM_FI_DEV_SM_CLOCK": (
                "SM clock frequency (in MHz).",
                lambda k: SM_BUSY_MHZ if util > 0.05 else SM_IDLE_MHZ,
            ),
            "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", lambda k: round(34 + 40 * util + k % 3)),
        }
        lines = []
        for name, (doc, value) in series.items():
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
            for k in range(self.count):
                labels = (
                    f'gpu="{k}",UUID="GPU-sim-{self.node}-{k}",device="nvidia{k}",modelName="{GPU_MODEL}",'
                    f'Hostname="{self.node}",simulated="true"'
                )
                lines.append(f"{name}{{{labels}}} {value(k)}")
        return "\n".join(lines) + "\n"


def _spread(k: int) -> float:
    """Tensor-parallel ranks are never exactly even: a fixed few percent per GPU."""
    return 1.0 - 0.015 * (k % 4)
