"""The flags of demo and sim, the commands that run the simulated engine; the engine's own flags come from
drivers/sim/serve.py, imported only when one of them is parsed."""

from __future__ import annotations

import argparse

from rampwatch.tui.cli.argtypes import positive_int, topology
from rampwatch.tui.cli.spec.common import add_record_args, add_refresh_arg, add_serve_metrics_arg, add_web_arg
from rampwatch.tui.cli.spec.ramp import add_ramp_args
from rampwatch.tui.cli.spec.trace import add_trace_replay_args

# The glm-like profile at 10x: a full two-session 1M ramp in about two minutes.
DEMO_TIME_SCALE = 10.0


def add_demo_args(p: argparse.ArgumentParser) -> None:
    from rampwatch.drivers.sim.serve import add_sim_args

    add_ramp_args(p, sessions_default=2, lockstep_default=True)
    add_trace_replay_args(p)
    add_sim_args(p, default_profile="glm-like")
    add_topology_arg(p, "--topology")
    # Exactly --output-tokens a turn, so decode (and its interference) stays visible.
    # 8 simulated GPUs per engine, so the GPUs panel shows load that follows the engine's steps.
    # The engine's own timing of every request, so each TTFT reads as queued + prefill + the rest.
    p.set_defaults(time_scale=DEMO_TIME_SCALE, ignore_eos=True, gpus=8, enable_per_request_metrics=True)
    p.add_argument("--headless", action="store_true", help="line output instead of the UI")
    add_refresh_arg(p)
    add_serve_metrics_arg(p)
    add_web_arg(p)
    add_record_args(p)


def add_topology_arg(p: argparse.ArgumentParser, flag: str) -> None:
    p.add_argument(
        flag,
        type=topology,
        default="single",
        metavar="single|replicas:N|router[:N]|pd",
        help="simulated deployment: one engine (default), N replicas the sessions are spread over, a router in "
        "front of N replicas (2 by default; --router-policy), or a prefill/decode split behind a proxy (each "
        "engine with its own /metrics)",
    )


def add_sim_command_args(p: argparse.ArgumentParser) -> None:
    from rampwatch.drivers.sim.serve import add_fault_args, add_sim_args, add_tls_args

    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port (default 8000; 0: free ports); a split, --replicas or a router also listens on the ports after it",
    )
    p.add_argument("--api-key-env", metavar="VAR", help="require this environment variable's value as a Bearer API key")
    add_sim_args(p)
    p.add_argument(
        "--topology",
        choices=("router",),
        default=None,
        help="router: a simulated router on PORT (send turns here; vllm-router's /metrics) in front of --replicas "
        "engines (default 2) on PORT+1.., each with its own /metrics and its name (r0, r1, ...) in its spans",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--replicas",
        type=positive_int,
        metavar="N",
        help="N engines on ports PORT..PORT+N-1, each with its own /metrics (behind --topology router: N replicas)",
    )
    g.add_argument(
        "--pd",
        action="store_true",
        help="a prefill/decode split: a proxy on PORT (send turns here), the prefill engine on PORT+1, "
        "the decode engine on PORT+2 (each with /metrics); the KV moves with a modelled transfer time",
    )
    add_tls_args(p)
    add_fault_args(p)
