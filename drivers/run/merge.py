"""--merge: the recordings of a run's shards (run --shard I/N, each its own process, often its own machine) read
as the one run they are: one header, one stream of events in time order, which every reader (the fold, report,
compare, export) takes as it takes a single recording.

Each shard's clock starts at its header's `started_at`; its times are moved onto the earliest shard's clock by
the difference of those wall-clock starts, so per-turn figures (one shard's clock each) are exact and orderings
across shards are as good as the machines' clocks agree (NTP), which a recording cannot tell."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.counted import counted
from rampwatch.drivers.model.modelled import shifted
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.recording import Recording

# What the servers said: every shard scraped the same servers and GPUs, so only one shard's are kept (two shards'
# samples of one counter, interleaved on clocks that differ, would count its growth twice and zig-zag).
SERVER_SIDE = (ev.MetricsSample, ev.MetricsError, ev.GpuSample, ev.GpuUnavailable)

# How bad a way to end is: the merged run ended the worst way any of its shards did.
_WORST = ("done", "time-limit", "saturated", "failed", "interrupted", "crashed")


class Merged(msgspec.Struct):
    recording: Recording  # the one run: its header says which parts it was merged from
    notes: list[str]  # what the reader should be told (a shard missing, a shard that did not end)


def _start(path: str, header: ev.Header) -> datetime:
    try:
        return datetime.fromisoformat(header.started_at)
    except ValueError:
        raise BadInput(
            f"{path}: its header has no start time ({header.started_at!r}): cannot put it on the other shards' clock"
        ) from None


def check_shards(parts: list[tuple[str, Recording]]) -> None:
    """BadInput, in one line, unless `parts` are distinct shards of one run: each recorded with --shard, all of
    the same N, salt, seed, sessions and --start-at (where recorded), no shard and no ramp session twice (only
    shard 0 runs the one-shot baseline; shards recorded before that each ran one: see merge_shards)."""
    if not parts:
        raise BadInput("--merge needs the shard recordings of one run (run --shard I/N)")
    first_path, first = parts[0][0], parts[0][1].header
    by_shard: dict[int, str] = {}
    by_session: dict[str, str] = {}
    for path, rec in parts:
        h = rec.header
        if h.shard is None:
            raise BadInput(f"{path}: not a shard (recorded without --shard I/N); --merge reads the shards of one run")
        i, n = h.shard
        if first.shard is not None and n != first.shard[1]:
            raise BadInput(
                f"not shards of one run: {path} is shard {i}/{n}, {first_path} shard {first.shard[0]}/{first.shard[1]}"
            )
        if h.salt != first.salt or h.seed != first.seed:
            raise BadInput(
                f"not shards of one run: {path} has salt {h.salt or '-'} (seed {h.seed}), "
                f"{first_path} salt {first.salt or '-'} (seed {first.seed})"
            )
        if h.sessions != first.sessions:
            raise BadInput(
                f"not shards of one run: {path} is of a run of {counted(h.sessions, 'session')}, "
                f"{first_path} of {first.sessions:,}"
            )
        if None not in (h.start_at, first.start_at) and h.start_at != first.start_at:  # two runs of one seed
            raise BadInput(
                f"not shards of one run: {path} started at --start-at {h.start_at:.0f}, "
                f"{first_path} at {first.start_at:.0f}"
            )
        if i in by_shard:
            raise BadInput(f"{by_shard[i]} and {path} are both shard {i}/{n}: give each shard once")
        by_shard[i] = path
        _start(path, h)
        for e in rec.events:
            if isinstance(e, ev.SessionPlanned) and e.role == "ramp":
                if by_session.get(e.session, path) != path:
                    raise BadInput(
                        f"not shards of one run: session {e.session} is in {by_session[e.session]} and {path}"
                    )
                by_session[e.session] = path


def merge_shards(parts: list[tuple[str, Recording]]) -> Merged:
    """The one run that shard recordings `parts` (path, recording) make; BadInput where they are not one run's.
    Shards may be missing (a pod that failed): the run is what the others recorded, and a note says so."""
    check_shards(parts)
    parts = sorted(parts, key=lambda p: p[1].header.shard or (0, 0))
    starts = [_start(path, rec.header) for path, rec in parts]
    origin = min(starts)
    shifts = [(s - origin).total_seconds() for s in starts]
    # The servers' side from one shard: the lowest that has any.
    server_part = next(
        (k for k, (_, rec) in enumerate(parts) if any(isinstance(e, SERVER_SIDE) for e in rec.events)), None
    )
    # With --one-shot, shard 0 alone runs the baseline; shards recorded before that each ran one: the lowest
    # shard's is the run's, the others' are left out (and said).
    baselines = [_baselines(rec) for _, rec in parts]
    baseline_part = next((k for k, ids in enumerate(baselines) if ids), None)
    streams: list[list[ev.AnyEvent]] = []
    ends: list[tuple[int, ev.RunEnded]] = []
    for k, ((_, rec), dt) in enumerate(zip(parts, shifts)):
        shard = rec.header.shard
        assert shard is not None  # check_shards
        end = next((e for e in reversed(rec.events) if isinstance(e, ev.RunEnded)), None)
        if end is not None:
            ends.append((shard[0], msgspec.structs.replace(end, t=end.t + dt)))
        drop = baselines[k] if k != baseline_part else set()
        streams.append(list(_part_events(rec, shard[0], dt, keep_servers=k == server_part, drop_sessions=drop)))
    first = parts[0][1].header
    n = first.shard[1] if first.shard is not None else len(parts)
    present = [shard_of(rec) for _, rec in parts]
    missing = [i for i in range(n) if i not in present]
    unended = [i for i in present if i not in {i for i, _ in ends}]
    extra = [shard_of(rec) for k, (_, rec) in enumerate(parts) if baselines[k] and k != baseline_part]
    notes = _notes(n, present, missing, unended, extra, shard_of(parts[baseline_part][1]) if extra else 0)
    header = msgspec.structs.replace(
        first,
        shard=None,
        started_at=parts[starts.index(origin)][1].header.started_at,
        sessions=first.sessions,  # every shard's header says the run's (check_shards)
        workers=len(parts),
        merged_from=[path for path, _ in parts],
    )
    events: list[ev.AnyEvent] = [ev.Notice(t=0.0, level="warn", message=notes[0])] if missing else []
    opening = _opening(streams)  # taken out of the streams
    events += heapq.merge(opening, *streams, key=lambda e: e.t)
    if ends and not unended:
        events.append(_worst_end(ends, n))
    truncated = any(rec.truncated_tail for _, rec in parts)
    return Merged(recording=Recording(header=header, events=events, truncated_tail=truncated), notes=notes)


def _notes(
    n: int, present: list[int], missing: list[int], unended: list[int], extra: list[int], baseline: int
) -> list[str]:
    """What the reader is told of a merge: the shards missing (first: the merged run's log says it too), those that
    did not end, the one-shot baselines left out."""

    def said(shards: list[int]) -> str:
        return ",".join(map(str, shards))

    notes = []
    if missing:
        notes.append(
            f"merged shards {said(present)} of {n} ({len(missing)} missing: shard {said(missing)}); the run is what "
            "the others recorded"
        )
    if unended:
        notes.append(
            f"shard {said(unended)} of {n} has no end (killed, or still running): the merged run has none either"
        )
    if extra:
        notes.append(
            f"shard {said(extra)} also ran the one-shot baseline: shard {baseline}'s is the run's, theirs are left out"
        )
    return notes


def _opening(streams: list[list[ev.AnyEvent]]) -> list[ev.AnyEvent]:
    """A closed loop's ramp sessions, every shard's planned together in their order (s1, s2, ...) as one driver
    plans them, at the earliest plan's time (the others' moved earlier by the shards' difference in start, a few
    ms; a plan's time is no figure's): taken out of `streams`. Else each shard's would come in a block (s1, s4,
    s2, s5, ...), and --warmup N's first N conversations would not be s1..sN. An open loop's plans stay at their
    times: they arrive in their order."""
    opening: list[ev.AnyEvent] = []
    for stream in streams:
        planned = [isinstance(e, ev.SessionPlanned) and e.role == "ramp" and e.arrival is None for e in stream]
        opening += [e for e, p in zip(stream, planned) if p]
        stream[:] = [e for e, p in zip(stream, planned) if not p]
    if not opening:
        return []
    t0 = min(e.t for e in opening)
    return [msgspec.structs.replace(e, t=t0) for e in sorted(opening, key=lambda e: _session_order(e.session))]


def _session_order(session: str) -> tuple[int, str]:
    """s1, s2, ..., s10 in number order (a session's id is s and its 1-based number); any other id after, by name."""
    return (int(session[1:]), "") if session[:1] == "s" and session[1:].isdigit() else (1 << 62, session)


def shard_of(rec: Recording) -> int:
    return rec.header.shard[0] if rec.header.shard is not None else 0


def _baselines(rec: Recording) -> set[str]:
    """The one-shot baseline sessions a recording planned."""
    return {e.session for e in rec.events if isinstance(e, ev.SessionPlanned) and e.role == "one-shot"}


def _part_events(
    rec: Recording, shard: int, dt: float, keep_servers: bool, drop_sessions: set[str]
) -> Iterator[ev.AnyEvent]:
    """One shard's events on the merged clock, in its own order: its sessions and its loop's lag tagged with the
    shard as their worker, a WorkerStarted first (the shard as a worker, on the host it ran on); its end left for
    the merged one, the servers' side left out unless this is the shard they are kept from, and the sessions of
    `drop_sessions` left out."""
    sessions = [e.session for e in rec.events if isinstance(e, ev.SessionPlanned) and e.session not in drop_sessions]
    yield ev.WorkerStarted(t=dt, worker=shard, pid=0, node=rec.header.host, sessions=sessions)
    for e in rec.events:
        if isinstance(e, ev.RunEnded) or (not keep_servers and isinstance(e, SERVER_SIDE)):
            continue
        if drop_sessions and getattr(e, "session", None) in drop_sessions:
            continue
        if isinstance(e, ev.SessionPlanned | ev.ClientLag) and e.worker is None:
            yield shifted(e, dt, worker=shard)
        else:
            yield shifted(e, dt)


def _worst_end(ends: list[tuple[int, ev.RunEnded]], n: int) -> ev.RunEnded:
    """One end for the merged run: the worst status any shard ended with (its exit code and error, the shard
    named), at the latest shard's end."""
    shard, worst = max(ends, key=lambda se: _WORST.index(se[1].status) if se[1].status in _WORST else len(_WORST))
    error = f"shard {shard}/{n}: {worst.error}" if worst.error else None
    return ev.RunEnded(t=max(e.t for _, e in ends), status=worst.status, exit_code=worst.exit_code, error=error)


def read_shards(paths: list[Path], read: Callable[[Path], Recording]) -> Merged:
    """The shard recordings at `paths`, each read by `read(path)` (read_recording, or a reader that notes what it
    skipped), merged."""
    return merge_shards([(str(p), read(p)) for p in paths])
