"""Deployments bigger than one server, simulated: N replicas, a router in
front of N replicas, or a prefill/decode split (a prefill engine, a decode
engine and a proxy in front), each engine with its own port and /metrics. This
module only names and describes them (cheap to import); deployment.py builds
their apps, proxy.py is the split's front and router.py the router.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rampwatch.drivers.sim.gpus import DCGM_PATH

_TOPOLOGY = re.compile(r"^(single|pd|replicas:([1-9][0-9]?)|router(?::([1-9][0-9]?))?)$")
ROUTER_REPLICAS = 2  # a router's replicas when `router` names no number
# The session header a router keys consistent hashing on (vllm-router reads it, among others): the run the sim
# suggests, and the demo, send it with each session's id.
SESSION_HEADER = "x-session-id"


@dataclass(frozen=True)
class Topology:
    """`single`, `replicas:N`, `router[:N]` or `pd`: which servers to start, each on its own socket."""

    kind: str  # single | replicas | router | pd
    replicas: int = 1

    @classmethod
    def parse(cls, text: str) -> Topology:
        m = _TOPOLOGY.match(text.strip())
        if m is None:
            raise ValueError(f"not a topology: {text!r} (use single, replicas:N, router[:N] or pd)")
        if m.group(2):
            return cls("replicas", int(m.group(2)))
        if m.group(1).startswith("router"):
            return cls("router", int(m.group(3) or ROUTER_REPLICAS))
        return cls(m.group(1))

    @property
    def sockets(self) -> int:
        """Listening sockets it needs: one per replica (and the router's); proxy, prefill and decode for a split."""
        return 3 if self.kind == "pd" else self.replicas + (self.kind == "router")

    def instances(self) -> list[str]:
        """Each engine's name in its spans (service.instance.id) and, behind a router, its /metrics endpoint's:
        r0, r1, ... where there are several; none for one engine or a split."""
        return [f"r{k}" for k in range(self.replicas)] if self.kind in ("replicas", "router") else []

    def describe(self, urls: list[str], gpus: int = 0) -> list[str]:
        extra = f", {DCGM_PATH} for {gpus} simulated GPUs" if gpus else ""
        if self.kind == "pd":
            return [
                f"proxy (send turns here) {urls[0]}",
                f"prefill engine {urls[1]}  (/metrics{extra})",
                f"decode engine {urls[2]}  (/metrics{extra})",
            ]
        if self.kind == "router":
            return [f"router (send turns here) {urls[0]}  (/metrics: vllm_router_*)"] + [
                f"replica {name} {u}  (/metrics{extra})" for name, u in zip(self.instances(), urls[1:], strict=True)
            ]
        return [f"engine {k + 1} {u}  (/metrics{extra})" for k, u in enumerate(urls)]

    def targets(self, urls: list[str]) -> tuple[list[str], list[str]]:
        """(servers to send turns to, --metrics-url specs; empty: each server's own /metrics)."""
        if self.kind == "pd":
            return [urls[0]], [f"prefill:prefill={urls[1]}/metrics", f"decode:decode={urls[2]}/metrics"]
        if self.kind == "router":
            replicas = [f"{name}={u}/metrics" for name, u in zip(self.instances(), urls[1:], strict=True)]
            return [urls[0]], [f"router:router={urls[0]}/metrics", *replicas]
        return list(urls), []

    def headers(self) -> list[str]:
        """--header values a run against it needs: a router's session key, so consistent hashing has one."""
        return [f"{SESSION_HEADER}: {{session}}"] if self.kind == "router" else []

    def run_args(self, urls: list[str], gpus: int = 0) -> list[str]:
        """How `rampwatch run` reaches these servers (and their simulated GPUs)."""
        targets, specs = self.targets(urls)
        gpu_args = [a for engine in self.engines(urls) for a in ("--gpu", engine + DCGM_PATH)] if gpus else []
        headers = [a for h in self.headers() for a in ("--header", h)]
        return [*targets, *(a for spec in specs for a in ("--metrics-url", spec)), *headers, *gpu_args]

    def engines(self, urls: list[str]) -> list[str]:
        """The URLs of the simulated engines (each serves /metrics, and /dcgm/metrics with --gpus)."""
        return urls[1:] if self.kind in ("pd", "router") else list(urls)

    def nodes(self, node: str) -> list[str]:
        """Each engine's node name: `node` alone, else numbered, or by role in a split."""
        if self.kind == "pd":
            return [f"{node}-prefill", f"{node}-decode"]
        return [node] if self.replicas == 1 else [f"{node}-{k + 1}" for k in range(self.replicas)]
