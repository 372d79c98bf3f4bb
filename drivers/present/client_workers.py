"""The client's check per driver worker (--workers N): each worker's loop lag, its CPU and the turns it marked,
a line a worker under the report's `client:` line. A run of one driver has none: its `client:` line says all."""

from __future__ import annotations

from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.client_check import ClientWorker


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
    busy = f"{w.busy_turns} turn{'' if w.busy_turns == 1 else 's'} client busy"
    busy += f", {w.busy_own_turns} by its own work" if own else ""
    return f"client {name}: lag worst {w.lag_max_ms:.1f} ms{own}, {cpu}; {busy}"
