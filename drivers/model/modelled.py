"""The modelled clock: a demo's simulated engine runs `time_scale` times faster than the engine it models, so
its recording's times (wall clock, kept raw) are read multiplied by that factor. RunState applies this to every
event it folds, the one place, so the live UI, replay and report all show the seed's units alike."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.model import events as ev

# Each event kind's times and durations besides `t` (the engine's measured in its sped-up time).
_TIMES: dict[type, tuple[str, ...]] = {
    ev.TurnDone: ("engine_prefill_s", "queued_s", "engine_decode_s", "prefill_leg_s"),
    ev.EngineSpan: ("queued_s", "prefill_s", "ttft_s", "decode_s", "e2e_s"),
    ev.SessionPlanned: ("arrival",),
    ev.RequestSent: ("due",),
    ev.UserPause: ("seconds",),
}


def time_factor(header: ev.Header | None) -> float:
    """Modelled seconds per recorded second: the header's time scale, 1 for a real server (or none given)."""
    scale = header.time_scale if header is not None else None
    return scale if scale and scale > 0 else 1.0


def speed_up(k: float) -> str:
    """What the header and report say once about a sped-up run's times."""
    return f"simulated {k:g}x faster than real time; times shown as modelled"


def modelled(e: ev.AnyEvent, k: float) -> ev.AnyEvent:
    """`e` with its times and durations multiplied by `k` (a copy; the recorded event stays raw).
    A client's own lag (ClientLag's ms figures) is wall time on the client and stays so."""
    changes: dict[str, object] = {"t": e.t * k}
    if isinstance(e, ev.TokenTimes):
        changes["times"] = [t * k for t in e.times]
    elif isinstance(e, ev.ClientLag):
        changes["busy"] = [(a * k, b * k) for a, b in e.busy]
    for name in _TIMES.get(type(e), ()):
        value = getattr(e, name)
        if value is not None:
            changes[name] = value * k
    return msgspec.structs.replace(e, **changes)
