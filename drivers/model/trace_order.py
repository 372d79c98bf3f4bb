"""A trace's requests put in due order as they stream: a row that carries the trace's clock (a timestamp in a
file sorted by time, a conversation's start in a file of conversations sorted by start) promises that no later
row is due before it, so every request due by then can go; the rest wait. What waits is what is live: a
session's turns read ahead of the clock, never the file."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from rampwatch.drivers.model.trace import TraceProblem, TraceRequest

_SORT_FIX = "sort the rows by time"


class DueOrder:
    """A buffer that takes requests in file order and gives them back in due order (ties in file order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TraceRequest]] = []
        self._seq = 0
        self.clock = float("-inf")  # no row still to come is due before this
        self.released = float("-inf")  # the due time of the last request given back

    def check(self, due_s: float, sets_clock: bool, line: int, item: int = 0) -> None:
        """TraceProblem if a request due at `due_s` can no longer be put in order."""
        if sets_clock and due_s < self.clock:
            raise TraceProblem(
                "order", line, f"due at {due_s:g} s, before an earlier row's {self.clock:g} s", _SORT_FIX, item
            )
        if due_s < self.released:
            raise TraceProblem(
                "order",
                line,
                f"due at {due_s:g} s, after requests due up to {self.released:g} s were already read",
                _SORT_FIX,
                item,
            )

    def push(self, request: TraceRequest, sets_clock: bool) -> None:
        heapq.heappush(self._heap, (request.due_s, self._seq, request))
        self._seq += 1
        if sets_clock:
            self.clock = max(self.clock, request.due_s)

    def ready(self) -> Iterator[TraceRequest]:
        """The requests due by the clock, in due order."""
        heap = self._heap
        while heap and heap[0][0] <= self.clock:
            due, _, request = heapq.heappop(heap)
            self.released = due
            yield request

    def drain(self) -> Iterator[TraceRequest]:
        """Everything left, in due order: the end of the file moves the clock past every row."""
        self.clock = float("inf")
        yield from self.ready()

    @property
    def waiting(self) -> int:
        return len(self._heap)
