"""What the metrics tell of the deployment behind a run: whether it is a prefill/decode split, where a split
has a session's turn, and how many sequences as long as the longest session one engine's KV pool holds."""

from __future__ import annotations

from collections.abc import Iterable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.endpoints import EndpointView
from rampwatch.drivers.model.views import GENERATING, SessionView


def split(endpoints: Iterable[EndpointView]) -> tuple[list[EndpointView], list[EndpointView]] | None:
    """(prefill, decode) endpoints of a prefill/decode split that have answered; None if not split."""
    answered = [x for x in endpoints if x.last_sample_t is not None]
    pre = [x for x in answered if x.role == "prefill"]
    dec = [x for x in answered if x.role == "decode"]
    return (pre, dec) if pre and dec else None


def decode_endpoints(endpoints: Iterable[EndpointView]) -> list[EndpointView] | None:
    """A split's decode endpoints (None: not split)."""
    both = split(endpoints)
    return both[1] if both is not None else None


def turn_place(endpoints: Iterable[EndpointView], s: SessionView) -> tuple[str, str] | None:
    """Where a split deployment has this session's turn, as far as the metrics tell: (phase, node), phase one of
    prefill, transfer (the decode node holds it, waiting for its KV), decode, queued. None when the deployment is
    not split or the session is not in a turn."""
    both = split(endpoints)
    if both is None or s.state not in ("prefilling", *GENERATING):
        return None
    pre, dec = both
    if s.state in GENERATING:
        return ("decode", dec[0].name if len(dec) == 1 else "")
    if busy := [x.name for x in pre if x.values.get("running", 0) > 0]:
        return ("prefill", busy[0])
    if held := [x.name for x in dec if x.values.get("waiting", 0) + x.values.get("running", 0) > 0]:
        return ("transfer", held[0])
    return ("queued", "")


def kv_fits_sequences(endpoints: Iterable[EndpointView], sessions: Iterable[SessionView]) -> int | None:
    """How many sequences as long as the longest session fit in one engine's KV pool: per endpoint (its own
    sessions' longest, or the run's where none is sent there), the tightest one."""
    sessions = list(sessions)
    longest_all = max((s.context_tokens or 0 for s in sessions), default=0)
    fits = []
    for ep in endpoints:
        pool = ep.engine_pool
        mine = [s.context_tokens or 0 for s in sessions if s.endpoint == ep.name]
        longest = max(mine, default=0) or longest_all
        if pool and longest:
            fits.append(int(pool // longest))
    return min(fits, default=None)


def router_workers(router: EndpointView, listed: Iterable[ev.Endpoint]) -> dict[str, float]:
    """A router's requests per worker since it first answered, each worker by the name of the endpoint it is
    where the run lists it (its URL, or its /metrics URL's base), else by the router's own label for it."""
    names: dict[str, str] = {}
    for x in listed:
        for url in (x.url, x.metrics.removesuffix("/metrics")):
            if url:
                names.setdefault(url.rstrip("/"), x.name)
    out: dict[str, float] = {}
    for label, n in router.workers.items():
        name = names.get(label.rstrip("/"), label)
        out[name] = out.get(name, 0.0) + n
    return out
