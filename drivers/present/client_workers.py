"""The driver workers (--workers N) in the report: each worker's loop lag, its CPU and the turns it marked, a line a
worker under the report's `client:` line; where they ran, how well their clocks agreed, and any worker lost. A run
of one driver has none: its `client:` line says all."""

from __future__ import annotations

from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.client_check import ClientWorker
from rampwatch.drivers.model.counted import counted


def client_worker_lines(rep: Report) -> list[str]:
    """`client w0: lag worst 8.1 ms (its own work 2.0 ms), CPU 71% (peak 98% of a second); 2 turns client busy,
    1 by its own work`, one per worker, when more than one worker's loop reported."""
    workers = rep.client_workers or []
    if len(workers) < 2:
        return []
    return [client_worker_line(w) for w in workers]


def client_worker_line(w: ClientWorker) -> str:
    name = f"w{w.worker}" if w.worker is not None else "driver"
    own = f" (its own work {w.lag_own_max_ms:.1f} ms)" if w.lag_own_max_ms is not None else ""
    if w.cpu_share is not None:
        peak = f" (peak {w.cpu_peak:.0%} of a second)" if w.cpu_peak is not None else ""
        cpu = f"CPU {w.cpu_share:.0%}{peak}"
    else:
        cpu = "CPU not recorded"
    busy = f"{counted(w.busy_turns, 'turn')} client busy"
    busy += f", {w.busy_own_turns} by its own work" if own else ""
    return f"client {name}: lag worst {w.lag_max_ms:.1f} ms{own}, {cpu}; {busy}"


def worker_lines(rep: Report) -> list[str]:
    """`workers: 2 (w0 on gpu-a: 32 sessions, w1 on gpu-b: 32 sessions); clocks agree within 0.4 ms`, and a line
    for each worker lost: what it had in flight and which sessions ended with it."""
    workers = rep.workers or []
    if not workers:
        return []
    where = ", ".join(
        f"w{w.worker}{f' on {w.node}' if w.node else ''}: {counted(len(w.sessions), 'session')}"
        + (f" from w{w.replaces}" if w.replaces is not None else "")
        for w in workers
    )
    offsets = [w.clock_offset_ms for w in workers if w.clock_offset_ms is not None]
    clocks = (
        f"; clocks agree within {max(offsets):.1f} ms (figures across workers carry it)"
        if offsets
        else "; clocks not measured (shards: as good as their hosts' wall clocks)"
    )
    lines = [f"workers: {len(workers)} ({where}){clocks}"]
    for w in workers:
        if w.lost is not None:
            sessions = ", ".join(w.lost_sessions) or "none"
            if w.resumed_on is None:
                went = f"sessions that ended with it: {sessions}"
            else:
                went = f"sessions that went on at their next turn on w{w.resumed_on}: {sessions} (and any to come)"
            lines.append(
                f"worker w{w.worker} LOST ({w.lost}): {counted(w.lost_turns, 'turn')} in flight "
                f"failed as `worker lost`; {went}"
            )
    return lines
