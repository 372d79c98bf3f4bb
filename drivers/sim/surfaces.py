"""Whose metrics surface a simulated engine serves: each flavour's /metrics renderer."""

from __future__ import annotations

from rampwatch.drivers.sim.metrics_sglang import SglangMetrics
from rampwatch.drivers.sim.metrics_vllm import VllmMetrics
from rampwatch.drivers.sim.profiles import SimProfile

FLAVORS = ("vllm", "sglang")


def metrics_for(flavor: str, profile: SimProfile, model: str) -> VllmMetrics | SglangMetrics:
    """The /metrics renderer of `flavor`: SGLang's names for sglang, vLLM's otherwise."""
    return SglangMetrics(profile, model) if flavor == "sglang" else VllmMetrics(profile, model)
