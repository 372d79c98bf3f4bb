"""The recording's first line for a run: what ran (the command, its modes and options, secrets hidden), against
what (the server's identity), and when."""

from __future__ import annotations

import platform

import rampwatch.drivers as drivers
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.probe import ServerInfo
from rampwatch.drivers.run.scrub import scrub_json, shown_headers
from rampwatch.drivers.telemetry.metrics import redact_url


def run_header(
    cfg: RunConfig,
    info: ServerInfo | None,
    *,
    salt: str,
    seed: int,
    started_at: str,
    sessions: int,
    prompts: ev.PromptShape | None,
    trace: ev.TraceRun | None = None,
) -> ev.Header:
    """`sessions`: those that ramp; `seed` is recorded for an open loop (its arrival times) only."""
    return ev.Header(
        rampwatch_version=drivers.__version__,
        command=cfg.command,
        mode=cfg.mode,
        server=cfg.base_url,
        model=info.model if info else None,
        engine=info.engine if info else None,
        engine_version=info.engine_version if info else None,
        max_model_len=info.max_model_len if info else None,
        host=platform.node(),
        started_at=started_at,
        sessions=sessions if cfg.mode != "watch" else 0,
        output_tokens=cfg.output_tokens,
        salt=salt,
        lockstep=cfg.lockstep,
        needle_mode="strict" if cfg.strict_needle else "verbatim",
        one_shot=cfg.one_shot,
        time_limit_s=cfg.time_limit,
        grace_s=cfg.grace,
        tls_verified=not cfg.insecure,
        endpoints=cfg.endpoints(),
        extra_body=scrub_json(cfg.extra_body),
        request_headers=shown_headers(cfg.request_headers),
        prompts=prompts,
        reasoning=cfg.reasoning,  # type: ignore[arg-type]
        max_tokens=cfg.max_tokens,
        arrivals_per_s=cfg.arrivals_per_s,
        seed=seed if cfg.arrivals_per_s or cfg.seed is not None else None,
        max_live=cfg.max_live,
        slo=cfg.slo,
        warmup=cfg.warmup,
        time_scale=cfg.time_scale,
        spans_expected=cfg.otlp is not None,
        trace=trace,
        workers=cfg.workers,
        cluster=redact_url(cfg.cluster) if cfg.cluster else None,
        shard=cfg.shard,
        start_at=cfg.start_at,
    )
