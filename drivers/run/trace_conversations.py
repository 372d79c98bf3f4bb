"""The formats with a whole conversation a line: agentic JSON (one conversation a line, or a whole file) and
AIPerf multi_turn. A line is refused whole when any of it cannot be used (its sessions would not hold together
without the request left out): the skip counts count lines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from rampwatch.drivers.model.trace import BadRows, TraceProblem, check_hash_ids, check_positive, tokens_for_text
from rampwatch.drivers.model.trace_sessions import TraceRow
from rampwatch.drivers.run.trace_file import decode, first_line, numbered_lines, open_binary

_ONE_FORMAT = "a trace is one format"
_SORT = "sort the requests by time"


class _AgenticRequest(msgspec.Struct):
    t: float  # seconds from the trace's start
    in_: int = msgspec.field(name="in")
    out: int
    hash_ids: list[int] | None = None
    type: str = ""
    agent: str | int | None = None  # subagent requests sharing one are one session (each its own without)


class _Conversation(msgspec.Struct):
    requests: list[_AgenticRequest] | None = None
    id: str | int | None = None
    conversation_id: str | int | None = None
    turns: Any = None  # an AIPerf session's mark: a line that has it is of that format


class _AiperfTurn(msgspec.Struct):
    output_length: int | None = None
    input_length: int | None = None  # the turn's new message; the history before it is added
    text: str | None = None
    delay: float | None = None  # ms after the previous turn
    timestamp: float | None = None  # ms from the trace's start


class _AiperfSession(msgspec.Struct):
    turns: list[_AiperfTurn] | None = None
    session_id: str | int | None = None
    requests: Any = None  # an agentic conversation's mark


def _each_line(path: Path, bad: BadRows, rows_of: Any, block_size: int) -> Iterator[TraceRow]:
    for number, line in numbered_lines(path):
        try:
            rows = rows_of(number, line, block_size)
        except TraceProblem as problem:
            bad.reject(problem)
            continue
        yield from rows


def agentic_rows(path: Path, bad: BadRows, block_size: int) -> Iterator[TraceRow]:
    """One conversation a line; a file whose first line is not a whole JSON value is one conversation (or a
    list of them) as one JSON document, read whole."""
    head = first_line(path)
    if head is None or _whole_line(head[1]):
        return _each_line(path, bad, _agentic_line, block_size)
    return _agentic_document(path, bad, block_size)


def _whole_line(line: bytes) -> bool:
    try:
        msgspec.json.decode(line)
    except msgspec.DecodeError:
        return False
    return True


def _agentic_document(path: Path, bad: BadRows, block_size: int) -> Iterator[TraceRow]:
    with open_binary(path) as f:
        data = f.read()
    conversations = decode(data, _Conversation | list[_Conversation], 1, "agentic conversation")  # type: ignore[arg-type]
    for conversation in conversations if isinstance(conversations, list) else [conversations]:
        try:
            rows = _conversation_rows(1, conversation, block_size)
        except TraceProblem as problem:
            bad.reject(problem)
            continue
        yield from rows


def _agentic_line(number: int, line: bytes, block_size: int) -> list[TraceRow]:
    return _conversation_rows(number, decode(line, _Conversation, number, "agentic conversation"), block_size)


def _conversation_rows(number: int, c: _Conversation, block_size: int) -> list[TraceRow]:
    """A conversation's requests as rows: the main requests one session (the conversation's id), each subagent
    (or each `agent` of them) its own session forked from the main session's latest turn before it."""
    if c.requests is None:
        other = "an AIPerf multi_turn session (it has turns)" if c.turns is not None else "a line of another format"
        raise TraceProblem("format", number, f"{other} in an agentic trace", _ONE_FORMAT)
    conv = str(c.id if c.id is not None else c.conversation_id if c.conversation_id is not None else f"line{number}")
    rows: list[TraceRow] = []
    main_turns = 0
    last_of: dict[str, int] = {}
    previous_t = float("-inf")
    for item, r in enumerate(c.requests, 1):
        if r.t < previous_t:
            raise TraceProblem("order", number, f"t {r.t:g} s comes after t {previous_t:g} s", _SORT, item)
        previous_t = r.t
        if r.hash_ids is None:
            raise TraceProblem("field", number, "no hash_ids", item=item)
        check_positive(r.in_, r.out, number, item)
        check_hash_ids(r.in_, r.hash_ids, block_size, number, item)
        row = TraceRow(
            line=number,
            item=item,
            input_length=r.in_,
            output_length=r.out,
            hash_ids=r.hash_ids,
            due_s=r.t,
            sets_clock=item == 1,
            kind=r.type,
        )
        if r.type == "subagent":
            name = f"{conv}/{r.agent}" if r.agent is not None else f"{conv}/sub{item}"
            if name not in last_of and main_turns:
                row.forked_from, row.fork_turn = conv, main_turns
            row.session_key = name
        else:
            main_turns += 1
            row.session_key = conv
        last_of[row.session_key] = len(rows)
        rows.append(row)
    for i in last_of.values():
        rows[i].closes_session = True
    return rows


def aiperf_rows(path: Path, bad: BadRows, block_size: int) -> Iterator[TraceRow]:
    return _each_line(path, bad, _aiperf_line, block_size)


def _aiperf_line(number: int, line: bytes, block_size: int) -> list[TraceRow]:
    s = decode(line, _AiperfSession, number, "AIPerf multi_turn session")
    if s.turns is None:
        other = "an agentic conversation (it has requests)" if s.requests is not None else "a line of another format"
        raise TraceProblem("format", number, f"{other} in an AIPerf multi_turn trace", _ONE_FORMAT)
    key = str(s.session_id) if s.session_id is not None else f"line{number}"
    rows: list[TraceRow] = []
    history = 0  # every earlier message and reply of the session, at their lengths
    due = 0.0
    for item, turn in enumerate(s.turns, 1):
        new = turn.input_length if turn.input_length is not None else tokens_for_text(turn.text or "")
        if turn.output_length is None:
            raise TraceProblem("field", number, "no output_length", item=item)
        check_positive(new, turn.output_length, number, item)
        if turn.timestamp is not None:
            at = turn.timestamp / 1000
        else:
            at = (due if item > 1 else 0.0) + (turn.delay or 0.0) / 1000
        if item > 1 and at < due:
            raise TraceProblem(
                "order", number, f"turn due at {at:g} s, before the previous turn at {due:g} s", item=item
            )
        due = at
        rows.append(
            TraceRow(
                line=number,
                item=item,
                input_length=history + new,
                output_length=turn.output_length,
                due_s=due,
                sets_clock=item == 1,
                session_key=key,
                text=turn.text,
            )
        )
        history += new + turn.output_length
    if rows:
        rows[-1].closes_session = True
    return rows
