"""`rampwatch sim`: serve the simulated engine in the foreground, on PORT (and the ports after it for
replicas or a prefill/decode split)."""

from __future__ import annotations

import argparse
import ssl

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
    if args.tls_cert or args.tls_key:
        if why := tls_refused(args, topology):
            return fail(why)
    count = Topology.parse(topology).sockets
    if not 0 <= args.port <= 65536 - count:
        return fail(f"--port {args.port}: 0 (free ports) or 1-{65536 - count} (this topology listens on {count})")
    ports = [args.port + k if args.port else 0 for k in range(count)]
    socks = []
    for port in ports:
        try:
            socks.append(loopback_socket(args.host, port))
        except OSError as e:
            return fail(f"cannot listen on {args.host}:{port}: {e.strerror or e}")
    serve(argparse.Namespace(**{**vars(args), "topology": topology}), socks)  # serve() reads the topology off it
    return 0


def tls_refused(args: argparse.Namespace, topology: str) -> str | None:
    """Why --tls-cert/--tls-key cannot serve, in one line, or None."""
    if not (args.tls_cert and args.tls_key):
        return "--tls-cert and --tls-key go together"
    if topology.startswith(("pd", "router")):
        return "--tls-cert serves one engine or --replicas (a split's proxy and a router reach theirs in plain HTTP)"
    try:
        # An encrypted key would have OpenSSL ask for its password on the terminal: refused instead.
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(args.tls_cert, args.tls_key, password=lambda: b"")
    except ssl.SSLError:  # an OSError too: first
        what = "not a PEM certificate and its private key (unencrypted)"
        return f"--tls-cert {args.tls_cert} / --tls-key {args.tls_key}: {what}"
    except OSError as e:
        return f"--tls-cert {args.tls_cert} / --tls-key {args.tls_key}: {e.strerror or e}"
    return None
