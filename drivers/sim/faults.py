"""The simulated engine's fault knobs, for the reliability tests: set at start
or at run time through POST /sim/faults."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class SimFaults:
    """Fault knobs. A count says how many of the next requests it hits; -1 means every one."""

    fail_status: int = 500
    fail_requests: int = 0
    drop_after_tokens: int = 0
    drop_requests: int = 0
    error_after_tokens: int = 0
    error_requests: int = 0
    stall_s: float = 0.0
    stall_requests: int = 0
    metrics: str = "ok"  # ok | 404 | malformed | slow

    def take(self, name: str) -> bool:
        n = getattr(self, name)
        if n == 0:
            return False
        if n > 0:
            setattr(self, name, n - 1)
        return True

    def update(self, data: dict[str, Any]) -> None:
        known = {f.name: f.type for f in fields(self)}
        for k, v in data.items():
            if k not in known:
                raise ValueError(f"unknown fault knob: {k}")
            setattr(self, k, v)


class SimulatedDrop(ConnectionAbortedError):
    """Raised inside a stream to cut the connection (fault knob drop_after_tokens)."""
