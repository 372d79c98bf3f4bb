"""The run's log, and how the events panel folds a burst of finished turns into one line.

A finished turn's entry carries the turn itself, not its text: its line is written where it is shown
(drivers/present/turn_text.py), from the figures the turn has then."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

from rampwatch.drivers.model.turns import TurnRecord

LOG_LEN = 500  # entries kept: the events panel and the headless lines read only the newest


class LogEntry(NamedTuple):
    """One line of the run's log; `turn` marks a finished turn's line (then `text` is what comes before it)."""

    t: float
    level: str  # info | warn | error | mark
    text: str
    turn: TurnRecord | None = None


class RunLog:
    """The run's log: the newest LOG_LEN entries, and how many were ever added, so a reader can tell which
    are new to it."""

    def __init__(self) -> None:
        self._kept: deque[LogEntry] = deque(maxlen=LOG_LEN)
        self.total = 0

    def add(self, entry: LogEntry) -> None:
        self._kept.append(entry)
        self.total += 1

    def new_since(self, seen: int) -> list[LogEntry]:
        """Entries added after the first `seen` (those still kept)."""
        n = min(self.total - seen, len(self._kept))
        return list(self._kept)[len(self._kept) - n :] if n > 0 else []

    def __iter__(self) -> Iterator[LogEntry]:
        return iter(self._kept)

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, i: int) -> LogEntry:
        return self._kept[i]


COLLAPSE_AT = 3  # finished turns in one second that the log shows as one line


def collapsed_log(entries: list[LogEntry]) -> list[LogEntry]:
    """The log with runs of COLLAPSE_AT or more turns that finished within the
    same second folded into one line: "12 turns done: TTFT 0.31-0.42s"."""
    out: list[LogEntry] = []
    group: list[LogEntry] = []

    def close() -> None:
        if len(group) >= COLLAPSE_AT:
            ttfts = [g.turn.ttft for g in group if g.turn is not None and g.turn.ttft is not None]
            span = f"TTFT {min(ttfts):.2f}-{max(ttfts):.2f}s" if ttfts else "no TTFT"
            out.append(LogEntry(group[-1].t, "info", f"{len(group)} turns done: {span}"))
        else:
            out.extend(group)
        group.clear()

    for e in entries:
        if e.turn is not None and group and int(e.t) == int(group[0].t):
            group.append(e)
            continue
        close()
        if e.turn is not None:
            group.append(e)
        else:
            out.append(e)
    close()
    return out
