"""`rampwatch demo`: a ramp against the simulated engine, started in a child process on free loopback ports."""

from __future__ import annotations

import argparse
from dataclasses import replace

from rampwatch.drivers.sim.gpus import DCGM_PATH
from rampwatch.drivers.sim.serve import ChildSim
from rampwatch.drivers.sim.topology import Topology
from rampwatch.tui.cli.errors import fail
from rampwatch.tui.cli.launch import execute_run
from rampwatch.tui.cli.options import demo_config


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    cfg = demo_config(args, argv)  # validate before starting anything
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
        return execute_run(cfg, record=not args.no_record, headless=args.headless, web=args.web, refresh_s=args.refresh)
    finally:
        child.__exit__()
