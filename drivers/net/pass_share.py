"""Many sessions' work spread over the driver loop's passes, so that no pass holds the loop long.

A run's start, or a lockstep barrier letting a turn go, makes hundreds of sessions ready in one pass of the loop.
Each then builds its turn (its text, its request) before it next waits, and the pass runs them all before the loop
looks at its sockets again: tokens that arrive meanwhile are stamped late, and their turns marked `client busy`
(a pass of 26 ms over 256 sessions' starts on one worker). A session asks `await take_turn()` before such a step:
it goes on at once while the pass has run less than SHARE_S, else it queues, and the queued steps go on in order,
a few a pass: each only while its pass has room (one that finds none waits first in line for the next).
The loop's reads run between them. On a loop that does not time its passes (not the driver's: a test's, the UI's)
every step goes on at once, as before."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

SHARE_S = 0.002  # a pass takes no queued step once it has run this long: well under the 5 ms that marks a turn
MOST_A_PASS = 64  # queued steps let go in one pass at most (each costs its release a few µs)


class PassShare:
    """The queue of steps waiting for a pass with room; `woke()`: when the current pass began (time.perf_counter)."""

    def __init__(self, woke: Callable[[], float]):
        self._woke = woke
        self._queue: deque[asyncio.Future[None]] = deque()
        self._again: list[asyncio.Future[None]] = []  # let go into a pass that had run full: first in the next
        self._batch = 1  # queued steps the next pass lets go
        self._let_go = 0  # ... and how many the last release let go

    async def turn(self) -> None:
        """Return in this pass if it has room and nothing waits before; else once a later pass with room lets
        it go (one that had no room when it came to it puts it first in line again)."""
        if not self._queue and not self._again and self._room():
            return
        loop = asyncio.get_running_loop()
        line = self._queue
        while True:
            waiting: asyncio.Future[None] = loop.create_future()
            if not self._queue and not self._again:  # a release is pending exactly while something waits
                loop.call_soon(self._release)
            line.append(waiting)
            await waiting  # a cancelled step's future is cancelled with it, and skipped
            if self._room():
                return
            line = self._again

    def _room(self) -> bool:
        return time.perf_counter() - self._woke() < SHARE_S

    def _release(self) -> None:
        """Let the next steps go: they run in the next pass, and this call after them. The batch is what the
        last one let go less those that found no room, doubled while a pass stays under half its share."""
        if self._again:
            self._batch = max(1, self._let_go - len(self._again))
            self._queue.extendleft(reversed(self._again))
            self._again = []
        elif time.perf_counter() - self._woke() < SHARE_S / 2:
            self._batch = min(MOST_A_PASS, self._batch * 2)
        self._let_go = 0
        while self._queue and self._let_go < self._batch:
            waiting = self._queue.popleft()
            if not waiting.done():
                waiting.set_result(None)
                self._let_go += 1
        if self._queue or self._again:
            asyncio.get_running_loop().call_soon(self._release)

    @property
    def waiting(self) -> int:
        return len(self._queue) + len(self._again)


async def take_turn() -> None:
    """Before a step of a session's turn that costs the loop more than a read: wait for a pass with room, on the
    driver's own loop (its `share`); at once on any other."""
    share: PassShare | None = getattr(asyncio.get_running_loop(), "share", None)
    if share is not None:
        await share.turn()
