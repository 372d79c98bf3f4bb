"""The blocks of a recorded trace replay. A run that replayed a trace (--trace) built each prompt from the trace's
hash-id blocks, so its recording, read as a trace, gives each turn the hash ids of the request it replayed: the
trace read again, cut as the run cut it, matched by session and turn. Sessions that shared a prefix in the trace
share it in the recording, as they did on the wire.

The trace's requests are read only as far as the recorded turns need: a turn is sent at or after its due time,
so what is held is the requests due and not yet sent. A turn whose prompt the server counted at another number of
blocks than the trace's (a server without /tokenize) keeps the trace's leading ids, cut to its length or
followed by ids of its own; a turn the trace does not have (another file now at that path) gets none (derived).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from rampwatch.drivers.model.trace import TraceRequest, blocks_for


class ReplayedBlocks:
    """The hash ids of a replayed trace's requests, by (session, turn), from its requests in due order."""

    def __init__(self, requests: Iterator[TraceRequest], block_size: int):
        self._requests = requests
        self._ahead: dict[tuple[str, int], Sequence[int]] = {}
        self.block_size = block_size
        self._own = 0  # ids of blocks past the trace's: negative, so no trace's id is ever one

    def hash_ids(self, session: str, turn: int, input_length: int) -> Sequence[int] | None:
        """Turn `turn` of `session`'s ids for a prompt of `input_length` tokens; None when the trace has no such
        turn."""
        key = (session, turn)
        ids = self._ahead.pop(key, None)
        while ids is None:
            r = next(self._requests, None)
            if r is None:
                return None
            if (r.session, r.turn) == key:
                ids = r.hash_ids
            else:
                self._ahead[(r.session, r.turn)] = r.hash_ids
        want = blocks_for(input_length, self.block_size)
        if want <= len(ids):
            return ids[:want]
        extra = range(-self._own - 1, -self._own - 1 - (want - len(ids)), -1)
        self._own += want - len(ids)
        return [*ids, *extra]
