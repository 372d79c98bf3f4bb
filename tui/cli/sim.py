"""`rampwatch sim`: serve the simulated engine in the foreground, on PORT (and the ports after it for
replicas or a prefill/decode split)."""

from __future__ import annotations

import argparse

from rampwatch.drivers.sim.serve import check_router_args, serve
from rampwatch.drivers.sim.sockets import loopback_socket
from rampwatch.drivers.sim.topology import Topology
from rampwatch.tui.cli.errors import fail


def execute(args: argparse.Namespace, argv: list[str]) -> int:
    if args.topology == "router":
        if args.pd:
            return fail("--topology router and --pd: a router fronts replicas, not a split")
        topology = f"router:{args.replicas or 2}"
    else:
        topology = "pd" if args.pd else f"replicas:{args.replicas}" if args.replicas else "single"
    try:
        check_router_args(argparse.Namespace(**{**vars(args), "topology": topology}))
    except ValueError as e:
        return fail(str(e))
    socks = []
    for k in range(Topology.parse(topology).sockets):
        try:
            socks.append(loopback_socket(args.host, args.port + k))
        except OSError as e:
            return fail(f"cannot listen on {args.host}:{args.port + k}: {e.strerror or e}")
    serve(argparse.Namespace(**{**vars(args), "topology": topology}), socks)  # serve() reads the topology off it
    return 0
