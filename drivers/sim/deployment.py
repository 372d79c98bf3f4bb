"""The ASGI apps a simulated deployment serves: one per socket of its topology."""

from __future__ import annotations

from typing import Any

from rampwatch.drivers.sim.app import SimServer
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.profiles import SimProfile
from rampwatch.drivers.sim.proxy import PdProxy
from rampwatch.drivers.sim.router import SimRouter
from rampwatch.drivers.sim.topology import Topology


def apps(
    topology: Topology,
    profile: SimProfile,
    faults: SimFaults,
    api_key: str | None,
    urls: list[str],
    server: dict[str, Any],
    router: dict[str, Any] | None = None,
) -> list[Any]:
    """One ASGI app per socket, in the order of `urls`. `server`: each engine's SimServer options
    (gpus, flavor, cache_report; `node` names the first and is numbered or suffixed for the others).
    `router`: a router topology's SimRouter options (policy, restart_after)."""
    names = topology.nodes(server.get("node", "sim-node"))
    opts = {k: v for k, v in server.items() if k != "node"}
    instances = topology.instances() or [""] * len(names)
    if topology.kind == "pd":
        return [
            PdProxy(urls[1], urls[2]).app,
            SimServer(profile, api_key=api_key, node=names[0], **opts).app,
            SimServer(profile, faults=faults, api_key=api_key, node=names[1], **opts).app,
        ]
    # Fault knobs are shared by the replicas: POST /sim/faults on one sets them for all.
    engines = [
        SimServer(profile, faults=faults, api_key=api_key, node=n, instance=i, **opts).app
        for n, i in zip(names, instances, strict=True)
    ]
    if topology.kind == "router":
        return [SimRouter(urls[1:], **(router or {})).app, *engines]
    return engines
