"""A trace's rows, as a format reads them, assembled into sessions of turns in due order.

Three ways a row says which session it belongs to:
- a session key (Mooncake's `session_id`, AIPerf's, an agentic conversation, a recording's session): rows
  sharing a key are one session's turns, in file order; a row with a delay instead of a timestamp is due that
  long after its session's previous turn;
- a parent id (Qwen-Bailian's `parent_chat_id`): a session is a parent chain. The first child of a turn
  continues its chain; a later child of the same turn is a branch, its own session forked from the parent's
  session after that turn (its prefix shared);
- neither (Mooncake rows without a `session_id`): each row is a one-turn session.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import msgspec

from rampwatch.drivers.model.trace import (
    BadRows,
    TraceProblem,
    TraceRequest,
    check_hash_ids,
    check_positive,
    derived_hash_ids,
)
from rampwatch.drivers.model.trace_order import DueOrder


class TraceRow(msgspec.Struct, kw_only=True):
    """One request as its format gives it, before it is placed in a session and in time."""

    line: int
    input_length: int
    output_length: int
    hash_ids: Sequence[int] | None = None  # None: the format has none; derived from the session
    due_s: float | None = None  # from the trace's start; None: `delay_s` after its session's previous turn
    delay_s: float | None = None
    sets_clock: bool = False  # its due time is the trace's clock: no later row is due before it
    session_key: str | None = None
    row_id: str | None = None  # parent-chained formats: this row's id ...
    parent_id: str | None = None  # ... and its parent's (None: a root)
    forked_from: str | None = None  # a keyed session's first row: the session key it forks from ...
    fork_turn: int = 0  # ... after that session's turn `fork_turn`
    closes_session: bool = False  # the format knows this is its session's last row
    kind: str = ""
    text: str | None = None
    item: int = 0  # formats with many requests a line: which one (1-based), for messages


class _Keyed:
    """A keyed session still open: its turns so far, its last due time, its derived-id ordinal."""

    __slots__ = ("last_due", "ordinal", "turns")

    def __init__(self, ordinal: int):
        self.ordinal, self.turns, self.last_due = ordinal, 0, 0.0


class _ChainTurn(NamedTuple):
    session: str
    turn: int
    line: int
    parent: str | None


class _Placed(NamedTuple):
    """Where a row goes, worked out before anything is changed (so a refused row leaves nothing behind)."""

    request: TraceRequest
    new_ordinal: bool


class SessionAssembly:
    """Places rows, in file order, into sessions and turns, and gives the requests back in due order."""

    def __init__(self, block_size: int, bad: BadRows | None = None):
        self.block_size = block_size
        self.bad = bad or BadRows()
        self.order = DueOrder()
        self._keyed: dict[str, _Keyed] = {}
        self._closed_keys: set[str] = set()
        self._chain: dict[str, _ChainTurn] = {}  # every chat id seen, so a parent can be found
        self._chain_turns: dict[str, int] = {}  # a chain session's turns so far
        self._chain_ordinals: dict[str, int] = {}
        self._refused_ids: set[str] = set()  # chat ids refused: their children are refused with them
        self._ordinals = 0
        self.origin: float | None = None  # the first row's timestamp: due times count from it

    def add(self, row: TraceRow) -> Iterator[TraceRequest]:
        """Place one row (or refuse it through `bad`); the requests now due, in due order."""
        try:
            self._place(row)
        except TraceProblem as problem:
            if row.row_id is not None:
                self._refused_ids.add(row.row_id)
            self.bad.reject(problem)
        return self.order.ready()

    def finish(self) -> Iterator[TraceRequest]:
        return self.order.drain()

    def _place(self, row: TraceRow) -> None:
        due = None
        if row.due_s is not None:
            if self.origin is None:
                self.origin = row.due_s
            due = row.due_s - self.origin
            if due < 0:
                raise TraceProblem(
                    "order",
                    row.line,
                    f"due at {row.due_s:g} s, before the trace's first row at {self.origin:g} s",
                    "sort the rows by time",
                    row.item,
                )
        if row.row_id is not None:
            placed = self._chained(row, due)
        elif row.session_key is not None:
            placed = self._keyed_turn(row, row.session_key, due)
        else:
            placed = self._one_turn(row, due)
        req = placed.request
        check_positive(req.input_length, req.output_length, row.line, row.item)
        check_hash_ids(req.input_length, req.hash_ids, self.block_size, row.line, row.item)
        self.order.check(req.due_s, row.sets_clock, row.line, row.item)
        self._commit(row, placed)
        self.order.push(req, row.sets_clock)

    def _request(self, row: TraceRow, session: str, turn: int, due_s: float, ordinal: int) -> TraceRequest:
        hash_ids = row.hash_ids
        if hash_ids is None:
            hash_ids = derived_hash_ids(ordinal, row.input_length, self.block_size)
        return TraceRequest(
            session=session,
            turn=turn,
            due_s=due_s,
            input_length=row.input_length,
            output_length=row.output_length,
            hash_ids=hash_ids,
            kind=row.kind,
            text=row.text,
            line=row.line,
        )

    def _one_turn(self, row: TraceRow, due: float | None) -> _Placed:
        if due is None:
            raise TraceProblem("field", row.line, "a row without a session needs a timestamp", item=row.item)
        req = self._request(row, f"row{row.line}", 1, due, self._ordinals)
        req.closes_session = True
        return _Placed(req, True)

    def _keyed_turn(self, row: TraceRow, key: str, due: float | None) -> _Placed:
        if key in self._closed_keys:
            raise TraceProblem(
                "duplicate", row.line, f"session {key!r} appears again after its last turn", item=row.item
            )
        if row.delay_s is not None and row.delay_s < 0:
            raise TraceProblem("order", row.line, f"delay is negative ({row.delay_s:g} s)", item=row.item)
        open_ = self._keyed.get(key)
        if open_ is None:
            if due is None:
                raise TraceProblem("field", row.line, f"session {key!r} starts here without a timestamp", item=row.item)
            req = self._request(row, key, 1, due, self._ordinals)
            req.forked_from, req.fork_turn = (row.forked_from, row.fork_turn) if row.fork_turn > 0 else (None, 0)
            req.closes_session = row.closes_session
            return _Placed(req, True)
        if due is None:
            due = open_.last_due + (row.delay_s or 0.0)
        if due < open_.last_due:
            raise TraceProblem(
                "order",
                row.line,
                f"session {key!r} has a turn due at {due:g} s, before its previous turn at {open_.last_due:g} s",
                "sort the rows by time",
                row.item,
            )
        req = self._request(row, key, open_.turns + 1, due, open_.ordinal)
        req.closes_session = row.closes_session
        return _Placed(req, False)

    def _chained(self, row: TraceRow, due: float | None) -> _Placed:
        chat, parent = row.row_id, row.parent_id
        assert chat is not None
        if parent == chat:
            raise TraceProblem("cycle", row.line, f"chat_id {chat} is its own parent", item=row.item)
        if chat in self._chain:
            first = self._chain[chat].line
            if parent is not None and self._descends_from(parent, chat):
                raise TraceProblem(
                    "cycle", row.line, f"chat_id {chat} (first at line {first}) would be its own ancestor"
                )
            raise TraceProblem("duplicate", row.line, f"chat_id {chat} appears again (first at line {first})")
        if due is None:
            raise TraceProblem("field", row.line, "a row needs a timestamp", item=row.item)
        if parent is None:
            return _Placed(self._request(row, chat, 1, due, self._ordinals), True)
        up = self._chain.get(parent)
        if up is None:
            said = "was refused above" if parent in self._refused_ids else "does not appear before this row"
            raise TraceProblem(
                "parent", row.line, f"parent_chat_id {parent} {said}", "a parent comes before its children"
            )
        if self._chain_turns[up.session] == up.turn:  # the parent ends its chain: this row continues it
            ordinal = self._chain_ordinals[up.session]
            return _Placed(self._request(row, up.session, up.turn + 1, due, ordinal), False)
        req = self._request(row, chat, 1, due, self._ordinals)  # a branch: its own session
        req.forked_from, req.fork_turn = up.session, up.turn
        return _Placed(req, True)

    def _descends_from(self, start: str, ancestor: str) -> bool:
        seen: set[str] = set()
        node: str | None = start
        while node is not None and node not in seen:
            if node == ancestor:
                return True
            seen.add(node)
            entry = self._chain.get(node)
            node = entry.parent if entry is not None else None
        return False

    def _commit(self, row: TraceRow, placed: _Placed) -> None:
        req = placed.request
        ordinal = self._ordinals
        if placed.new_ordinal:
            self._ordinals += 1
        if row.row_id is not None:
            self._chain[row.row_id] = _ChainTurn(req.session, req.turn, row.line, row.parent_id)
            self._chain_turns[req.session] = req.turn
            if req.turn == 1:
                self._chain_ordinals[req.session] = ordinal
        elif row.session_key is not None:
            key = row.session_key
            open_ = self._keyed.get(key)
            if open_ is None:
                open_ = self._keyed[key] = _Keyed(ordinal)
            open_.turns, open_.last_due = req.turn, req.due_s
            if req.closes_session:
                del self._keyed[key]
                self._closed_keys.add(key)


def assemble(rows: Iterable[TraceRow], block_size: int, bad: BadRows | None = None) -> Iterator[TraceRequest]:
    """The requests of `rows` (in file order) in due order, placed in sessions; bad rows refused through `bad`
    (raised, or counted and skipped)."""
    assembly = SessionAssembly(block_size, bad)
    for row in rows:
        yield from assembly.add(row)
    yield from assembly.finish()
