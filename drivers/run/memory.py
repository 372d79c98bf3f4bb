"""The driver's allocator and collector tuned for a long run: big buffers go back to the OS, and what lives as
long as the run is kept out of the garbage collector's passes, so neither holds the stamping loop mid-stream."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
FREEZE_EVERY_S = 5.0  # how often the run's survivors are frozen (keep_survivors_frozen)


def return_big_buffers_to_the_os() -> None:
    """Have glibc serve allocations of 1 MiB or more with mmap, always. Building a
    1M-token turn's new message takes several MB of short-lived pieces; by default
    glibc raises its mmap threshold after the first such buffer is freed, and later
    ones then come from the heap, whose high-water mark (many sessions building at
    once) stays resident for the rest of the run."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):
        pass  # not glibc (musl, ...): its own policy stands


@contextmanager
def set_up_heap_frozen() -> Iterator[None]:
    """Everything set up before the run (modules, config, the probe) lives as long as it: collect it now and
    leave it out of every later collection, or the first full one holds the loop 20-40 ms mid-stream. Unfrozen
    at the end, so a process that drives many runs (a sweep's points) frees each one's cycles."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def keep_survivors_frozen(period_s: float = FREEZE_EVERY_S) -> None:
    """Every `period_s`: collect the young generations (their cycles freed) and freeze what survived. A full
    collection walks every object the collector tracks, and a trace's 10,000 sessions grew that walk to a 370 ms
    hold of the loop; frozen, the run's finished turns and sessions are left out, and a full collection walks
    only what came since the last freeze. set_up_heap_frozen's unfreeze gives them back at the run's end."""
    while True:
        await asyncio.sleep(period_s)
        gc.collect(1)
        gc.freeze()
