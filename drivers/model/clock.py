"""The run's clock: seconds since the run started, on the high-resolution
monotonic clock. That clock is system-wide, so the UI process reads the same
time as the driver process once it knows the driver's origin."""

from __future__ import annotations

import time


class RunClock:
    """Callable: seconds since `origin` (a time.perf_counter() reading)."""

    __slots__ = ("origin",)

    def __init__(self, origin: float | None = None):
        self.origin = time.perf_counter() if origin is None else origin

    def __call__(self) -> float:
        return time.perf_counter() - self.origin
