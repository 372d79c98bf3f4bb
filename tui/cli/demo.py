"""`rampwatch demo`: a ramp against the simulated engine, started in a child process on free loopback ports."""

from __future__ import annotations

import argparse
import socket
from dataclasses import replace

from rampwatch.drivers.client.request_options import parse_header
from rampwatch.drivers.sim.gpus import DCGM_PATH
from rampwatch.drivers.sim.serve import ChildSim, check_router_args
from rampwatch.drivers.sim.topology import Topology
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.launch import execute_run
from rampwatch.tui.cli.options import demo_config


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    cfg = demo_config(args, argv)  # validate before starting anything
    try:
        check_router_args(args)
    except ValueError as e:
        return fail(str(e))
    # The engine's own account of each turn both ways, as vLLM gives it: per-request metrics on each response
    # (the demo's default) and a trace span per request to the run's --otlp receiver, which checks them.
    if not args.otlp_traces_endpoint:  # the user's own collector, when given, gets them instead
        otlp_port = free_loopback_port()
        args.otlp_traces_endpoint = f"http://127.0.0.1:{otlp_port}/v1/traces"
        cfg = replace(cfg, otlp=f"127.0.0.1:{otlp_port}")
    try:
        child = ChildSim(args)
        child.wait_ready()
    except (OSError, RuntimeError) as e:
        return fail(f"cannot start the simulated engine: {e}")
    try:
        topology = Topology.parse(args.topology)
        targets, metrics_urls = topology.targets(child.urls)
        gpu = [engine + DCGM_PATH for engine in topology.engines(child.urls)] if args.gpus else cfg.gpu
        cfg = replace(cfg, url=targets[0], more_urls=targets[1:], metrics_urls=metrics_urls, gpu=gpu)
        # Behind a router each session says who it is (consistent hashing keys on it), unless the user set it.
        given = {h.name.lower() for h in cfg.request_headers}
        more = [parse_header(h) for h in topology.headers() if h.partition(":")[0].lower() not in given]
        if more:
            cfg = replace(cfg, request_headers=[*cfg.request_headers, *more])
        return execute_run(cfg, record=not args.no_record, headless=args.headless, web=args.web, refresh_s=args.refresh)
    finally:
        child.__exit__()


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (the driver binds it once the engine is up; the engine sends its first
    span only when its first request ends)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
