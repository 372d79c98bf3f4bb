"""The ASGI apps a simulated deployment serves: one per socket of its topology."""

from __future__ import annotations

from typing import Any

from rampwatch.drivers.sim.app import SimServer
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.profiles import SimProfile
from rampwatch.drivers.sim.proxy import PdProxy
from rampwatch.drivers.sim.topology import Topology


def apps(
    topology: Topology,
    profile: SimProfile,
    faults: SimFaults,
    api_key: str | None,
    urls: list[str],
    server: dict[str, Any],
) -> list[Any]:
    """One ASGI app per socket, in the order of `urls`. `server`: each engine's SimServer options
    (gpus, flavor, cache_report; `node` names the first and is numbered or suffixed for the others)."""
    names = topology.nodes(server.get("node", "sim-node"))
    opts = {k: v for k, v in server.items() if k != "node"}
    if topology.kind == "pd":
        return [
            PdProxy(urls[1], urls[2]).app,
            SimServer(profile, api_key=api_key, node=names[0], **opts).app,
            SimServer(profile, faults=faults, api_key=api_key, node=names[1], **opts).app,
        ]
    # Fault knobs are shared by the replicas: POST /sim/faults on one sets them for all.
    return [SimServer(profile, faults=faults, api_key=api_key, node=n, **opts).app for n in names]
