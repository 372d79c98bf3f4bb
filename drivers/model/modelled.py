"""The times events carry, read on another clock: a demo's simulated engine runs `time_scale` times faster than
the engine it models, so its recording's times (wall clock, kept raw) are read multiplied by that factor
(`modelled`); a shard's recording starts its own clock, so a merge of shards moves each one's times onto the
earliest shard's (`shifted`). RunState applies the factor to every event it folds, the one place, so the live
UI, replay and report all show the seed's units alike."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.model import events as ev

# Each event kind's instants on the run clock besides `t` (TokenTimes' times, its counts as they are, and
# ClientLag's busy windows are lists, handled in the functions): scaled with a sped-up engine, shifted with a
# shard's start.
_INSTANTS: dict[type, tuple[str, ...]] = {
    ev.SessionPlanned: ("arrival",),
    ev.RequestSent: ("due",),
    ev.MetricsSample: ("asked_t",),
}
# ... and its durations (the engine's measured in its sped-up time): scaled, never shifted.
_DURATIONS: dict[type, tuple[str, ...]] = {
    ev.TurnDone: ("engine_prefill_s", "queued_s", "engine_decode_s", "prefill_leg_s"),
    ev.EngineSpan: ("queued_s", "prefill_s", "ttft_s", "decode_s", "e2e_s"),
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
    for name in (*_INSTANTS.get(type(e), ()), *_DURATIONS.get(type(e), ())):
        value = getattr(e, name)
        if value is not None:
            changes[name] = value * k
    return msgspec.structs.replace(e, **changes)


def shifted(e: ev.AnyEvent, dt: float, **changes: object) -> ev.AnyEvent:
    """`e` with its instants on the run clock moved `dt` seconds later (its durations as they were), and
    `changes` made too: a copy, for a merged shard whose clock started `dt` after the earliest one's."""
    changes["t"] = e.t + dt
    if isinstance(e, ev.TokenTimes):
        changes["times"] = [t + dt for t in e.times]
    elif isinstance(e, ev.ClientLag):
        changes["busy"] = [(a + dt, b + dt) for a, b in e.busy]
    for name in _INSTANTS.get(type(e), ()):
        value = getattr(e, name)
        if value is not None:
            changes[name] = value + dt
    return msgspec.structs.replace(e, **changes)
