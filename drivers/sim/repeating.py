"""A reply's SSE events, which repeat: runs of them rendered as a few byte slices (the 'fast' profile's stream)."""

from __future__ import annotations

import itertools


class RepeatingEvents:
    """The SSE events of a reply's words, which repeat (engine.reply_words): any run of them as a few slices of
    bytes built once, so a long burst of the 'fast' profile costs its process little beside the client."""

    def __init__(self, events: list[bytes]):
        self.n = len(events)
        self.twice = b"".join(events) * 2
        self.at = list(itertools.accumulate((len(e) for e in events + events), initial=0))  # each event's offset

    def events(self, k: int, count: int) -> bytes:
        """The events of words k .. k+count-1 (k counted from the reply's first word)."""
        i = k % self.n
        whole, rest = divmod(count, self.n)
        tail = self.twice[self.at[i] : self.at[i + rest]]
        return self.twice[self.at[i] : self.at[i + self.n]] * whole + tail if whole else tail
