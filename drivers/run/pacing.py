"""When a session may start its next turn: never after the time limit, and
in lockstep only once every live session has finished the turn before."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable


class TurnGate:
    """Shared by a run's sessions. A session `join()`s when it starts after the
    gate was made, asks `before(turn)`, reports `after(turn)` and `leave()`s
    when it ends, so a failed or finished session never holds the others at
    the barrier."""

    def __init__(self, sessions: int, lockstep: bool = False):
        self.live = sessions
        self.lockstep = lockstep
        self.time_up = False
        self._finished: Counter[int] = Counter()
        self._changed = asyncio.Event()
        self.listeners: list[Callable[[int], None]] = []  # told each change, with the turn it counted (0: none)

    def _notify(self, turn: int = 0) -> None:
        # A fresh event per change: every waiter wakes and checks its own condition.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for listener in self.listeners:
            listener(turn)

    def finished(self, turn: int) -> int:
        """Sessions that have finished turn `turn`."""
        return self._finished[turn]

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    async def before(self, turn: int) -> bool:
        """Wait until turn `turn` may start; False: start no more turns."""
        if self.lockstep and turn > 1:
            await self._until(lambda: self.time_up or self._finished[turn - 1] >= self.live)
        return not self.time_up

    def after(self, turn: int) -> None:
        self._finished[turn] += 1
        self._notify(turn)

    def join(self) -> None:
        """A session that starts later (the one-shot baseline after the ramp) counts at the barrier from now on."""
        self.live += 1
        self._notify()

    def leave(self) -> None:
        self.live -= 1
        self._notify()

    def expire(self) -> None:
        """The time limit: no new turn starts from now on."""
        self.time_up = True
        self._notify()
