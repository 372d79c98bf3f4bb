"""Flags several commands share: where the recording goes, the servers, metrics and GPUs watched beside the
traffic, and how a run is shown (the UI's refresh, --web, --serve-metrics)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rampwatch.tui.cli.argtypes import positive_float
from rampwatch.tui.refresh import REFRESH_S


def add_record_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--record",
        type=Path,
        metavar="PATH",
        help="write the recording here (default: recordings/<time>-<model>.jsonl)",
    )
    g.add_argument("--no-record", action="store_true", help="do not write a recording")


def add_server_watch_args(p: argparse.ArgumentParser, ui: bool = True) -> None:
    """The flags of every command that drives or watches servers; `ui`: it can show the UI (sweep cannot)."""
    p.add_argument(
        "--metrics-url",
        action="append",
        default=None,
        metavar="[ROLE:][NAME=]URL",
        help="a /metrics endpoint to scrape, repeatable: NAME labels it (default host:port), ROLE is "
        "prefill, decode, both (default) or router (a router's own metrics: its requests per worker); e.g. "
        "prefill:p0=http://10.0.0.1:8000/metrics (default: each server's URL/metrics)",
    )
    p.add_argument(
        "--gpu",
        action="append",
        default=None,
        metavar="auto|none|URL",
        help="GPU source: auto = NVML when present, none, or a dcgm-exporter /metrics URL; repeatable, one "
        "URL per node (GPUs are labelled by the exporter's Hostname, else the URL's host) (default auto)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="read server and GPU figures from this Prometheus server's HTTP API (engines' vllm:/sglang:/"
        "llamacpp: series unless --metrics-url, DCGM_FI_DEV_* unless --gpu; one endpoint per instance)",
    )
    p.add_argument(
        "--prometheus-match",
        action="append",
        default=None,
        metavar="[ROLE:]MATCHERS",
        help="with --prometheus: read only the engines these PromQL label matchers select, repeatable, ROLE "
        "prefill, decode or both (default); e.g. 'prefill:job=\"llm-prefill\"' (default: every engine)",
    )
    p.add_argument(
        "--prometheus-gpu-match",
        metavar="MATCHERS",
        help="with --prometheus: read only the dcgm-exporter GPUs these label matchers select, e.g. "
        "'Hostname=~\"gpu-node-(1|2)\"' (default: every GPU)",
    )
    add_serve_metrics_arg(p)
    p.add_argument(
        "--otlp",
        metavar="[HOST:]PORT",
        help="receive the engine's OTLP/HTTP trace spans (protobuf, POST /v1/traces) on this port and join each to "
        "its turn: queued, prefill and decode per turn without per-request metrics (HOST default 127.0.0.1; vLLM: "
        "--otlp-traces-endpoint http://HOST:PORT/v1/traces with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)",
    )
    p.add_argument(
        "--scrape-interval",
        type=positive_float,
        default=0.5,
        metavar="S",
        help="seconds between /metrics scrapes (default 0.5)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="read the API key from this environment variable (default: OPENAI_API_KEY when set)",
    )
    p.add_argument("--api-key-file", metavar="PATH", help="read the API key from this file (first line)")
    p.add_argument(
        "--metrics-auth-env",
        metavar="VAR",
        help="send this environment variable's value as a Bearer token to metrics and GPU URLs (the API "
        "key goes to the inference servers only; user:password@ in a metrics URL goes as Basic auth)",
    )
    p.add_argument(
        "--ca-bundle",
        type=Path,
        metavar="PATH",
        help="trust these CA certificates (PEM) for https URLs, instead of certifi's bundle",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="verify no TLS certificate (said in the header, the recording and the output)",
    )
    p.add_argument("--headless", action="store_true", help="line output instead of the UI (for scripts and CI)")
    if ui:
        add_refresh_arg(p)
    add_web_arg(p)
    add_record_args(p)


def add_serve_metrics_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--serve-metrics",
        metavar="[HOST:]PORT",
        help="expose rampwatch's own figures (TTFT, decode tok/s, gaps, prefill in flight, turns, needle) "
        "for Prometheus at http://HOST:PORT/metrics (HOST default 127.0.0.1)",
    )


def add_refresh_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--refresh",
        type=positive_float,
        default=REFRESH_S,
        metavar="SECONDS",
        help="redraw the UI every SECONDS (default 0.5: a two-session ramp writes ~3 KB/s to a 120x40 "
        "terminal; raise it on a slow SSH link)",
    )


def add_web_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--web",
        metavar="[HOST:]PORT",
        help="serve the UI in a browser at http://HOST:PORT (textual-serve; HOST default 127.0.0.1); "
        "this terminal gets the line output",
    )
