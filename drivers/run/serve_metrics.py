"""--serve-metrics: rampwatch's own figures for Prometheus, served from the process that folds the events
(the headless run itself, or the UI beside a driver process), and kept up a while after a run."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.config import BadInput, RunConfig
from rampwatch.drivers.telemetry.client_metrics import ClientMetrics, parse_listen

EXPORTER_LINGER_S = 15.0  # headless: how long the final figures stay up for a last scrape


def start_exporter(
    cfg: RunConfig, state_of: Callable[[], RunState | None], clock: Callable[[], float], run: str
) -> ClientMetrics | None:
    """The exporter of the fold `state_of()` listening at cfg.serve_metrics (None when not asked for); BadInput
    when it cannot listen. Hand it every event after the fold applied it (a listener)."""
    if not cfg.serve_metrics:
        return None
    host, port = parse_listen(cfg.serve_metrics)
    exporter = ClientMetrics(state_of, clock, run=run)
    try:
        exporter.serve(host, port)
    except OSError as e:
        raise BadInput(f"--serve-metrics {cfg.serve_metrics}: cannot listen: {e.strerror or e}") from None
    print(f"rampwatch: serving its own metrics on http://{host}:{exporter.port}/metrics", file=sys.stderr, flush=True)
    return exporter


def linger_for_last_scrape(seconds: float = EXPORTER_LINGER_S) -> None:
    """Keep the final figures up (the caller closes the exporter after): Prometheus scrapes on its own
    interval, and a run's last turns should not vanish between two scrapes."""
    print(
        f"rampwatch: its metrics stay up {seconds:.0f} s for a last scrape (Ctrl-C to leave now)",
        file=sys.stderr,
        flush=True,
    )
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        pass
