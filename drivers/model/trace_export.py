"""A trace's requests written in a format the peers replay (`rampwatch trace export`): Mooncake JSONL with AIPerf's
session_id (AIPerf's `mooncake_trace`), or AIPerf `multi_turn` sessions. Pure: the requests come in due order and
leave as the format's rows; the file is drivers/run/trace_export.py's.

- Mooncake: one row a request, in due order: `session_id`, `timestamp` (its due time, ms from the trace's start,
  rounded to the ms), `input_length` (the whole prompt), `output_length` and `hash_ids` at 512 tokens a block
  (trace_reblock.py: prompts that share k blocks of tokens share k ids).
- AIPerf multi_turn: one line a session, in the order sessions start: its first turn's `timestamp`, each later
  turn's `delay` (ms after the previous turn was due, so the delays add up to the due times), `input_length` the
  turn's new message (its prompt less the session's previous prompt and reply: AIPerf sends the history itself)
  and `output_length`. The format has no hash ids: a prefix sessions share is not carried. A turn whose prompt is
  shorter than its session's previous prompt and reply (a conversation cut short or compacted) cannot continue
  it in this format: it starts a session of its own, named SESSION~TURN, with its whole prompt as its message.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from rampwatch.drivers.model.trace import BLOCK_SIZES, TraceRequest
from rampwatch.drivers.model.trace_reblock import Reblocker

EXPORT_FORMATS = ("mooncake", "aiperf")


class MooncakeRow(msgspec.Struct):
    session_id: str
    timestamp: int  # ms from the trace's start
    input_length: int
    output_length: int
    hash_ids: list[int]


class AiperfTurn(msgspec.Struct, omit_defaults=True):
    input_length: int  # the turn's new message; the prompt is the session's history plus it
    output_length: int
    timestamp: int | None = None  # the session's first turn: ms from the trace's start
    delay: int | None = None  # a later turn: ms after the session's previous turn was due


class AiperfSession(msgspec.Struct):
    session_id: str
    turns: list[AiperfTurn]


def due_ms(request: TraceRequest) -> int:
    return round(request.due_s * 1000)


class MooncakeRows:
    """Each request as a Mooncake row, its hash ids re-blocked from the trace's block size to Mooncake's."""

    def __init__(self, source_block: int):
        self.blocks = Reblocker(source_block, BLOCK_SIZES["mooncake"])

    def row(self, r: TraceRequest) -> MooncakeRow:
        return MooncakeRow(
            session_id=r.session,
            timestamp=due_ms(r),
            input_length=r.input_length,
            output_length=r.output_length,
            hash_ids=self.blocks.ids(r.hash_ids, r.input_length),
        )


class _Open:
    """A session being gathered: its line so far, and what its next turn's prompt starts with."""

    __slots__ = ("closed", "history", "last_ms", "line")

    def __init__(self, line: AiperfSession):
        self.line, self.history, self.last_ms, self.closed = line, 0, 0, False


class AiperfSessions:
    """Requests gathered into AIPerf sessions, each line given back once its session is complete and every session
    that started before it has been given: what is held is the sessions still open and those started after them."""

    def __init__(self) -> None:
        self._open: dict[str, _Open] = {}  # by the name the trace gives the session
        self._order: dict[int, _Open] = {}  # every session not yet given back, by when it started
        self.started = 0  # sessions begun, the split ones included
        self._given = 0
        self.split = 0  # turns that had to start a session of their own (the context shrank)

    def add(self, r: TraceRequest) -> Iterator[AiperfSession]:
        """Place one request (in due order); the lines now complete, in the order their sessions started."""
        s = self._open.get(r.session)
        at = due_ms(r)
        if s is not None and r.input_length <= s.history:
            self.split += 1
            s.closed = True
            s = None
            name = f"{r.session}~{r.turn}"
        else:
            name = r.session
        if s is None:
            s = self._open[r.session] = _Open(AiperfSession(session_id=name, turns=[]))
            self._order[self.started] = s
            self.started += 1
            s.line.turns.append(AiperfTurn(r.input_length, r.output_length, timestamp=at))
        else:
            s.line.turns.append(AiperfTurn(r.input_length - s.history, r.output_length, delay=at - s.last_ms))
        s.history, s.last_ms = r.input_length + r.output_length, at
        if r.closes_session:
            s.closed = True
            del self._open[r.session]
        return self._ready()

    def finish(self) -> Iterator[AiperfSession]:
        """Every line still held, in the order the sessions started."""
        for s in self._open.values():
            s.closed = True
        self._open.clear()
        return self._ready()

    def _ready(self) -> Iterator[AiperfSession]:
        while self._given in self._order and self._order[self._given].closed:
            yield self._order.pop(self._given).line
            self._given += 1
