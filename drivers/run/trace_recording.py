"""A rampwatch recording read as a trace: the same sessions, each turn due when it was first sent (a retry is the
same turn), its context the prompt tokens the server reported, its output the completion tokens. A turn's sizes
are its first TurnDone's, so turns wait in send order until theirs has come; what waits is the turns in flight,
never the file. A turn the server reported no sizes for (failed, or never finished in a killed run) keeps the
size it was sent at and the run's output budget."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path

import msgspec

from rampwatch.drivers.model.events import SCHEMA, Header, RequestSent, SessionPlanned, TurnDone
from rampwatch.drivers.model.trace import BadRows, TraceProblem
from rampwatch.drivers.model.trace_sessions import TraceRow
from rampwatch.drivers.run.recording import decode_event
from rampwatch.drivers.run.trace_file import numbered_lines

_header_decoder = msgspec.json.Decoder(Header)


class _Sent:
    """A turn sent and not yet resolved to the sizes it had."""

    __slots__ = ("input_length", "kind", "line", "output_length", "planned", "resolved", "session", "t", "turn")

    def __init__(self, e: RequestSent, line: int, kind: str, planned: int, output_length: int):
        self.session, self.turn, self.t, self.line, self.kind = e.session, e.turn, e.t, line, kind
        self.planned = planned
        self.input_length = e.target_tokens
        self.output_length = output_length
        self.resolved = False

    def row(self) -> TraceRow:
        return TraceRow(
            line=self.line,
            input_length=self.input_length,
            output_length=self.output_length,
            due_s=self.t,
            sets_clock=True,
            session_key=self.session,
            kind=self.kind,
            closes_session=self.turn == self.planned,
        )


def recording_rows(path: Path, bad: BadRows, block_size: int) -> Iterator[TraceRow]:
    lines = numbered_lines(path)
    header = _header(path, next(lines, None))
    output_default = header.max_tokens or header.output_tokens or 1
    planned: dict[str, tuple[str, int]] = {}  # session -> (role, turns planned)
    waiting: deque[_Sent] = deque()
    by_turn: dict[tuple[str, int], _Sent] = {}
    last_turn: dict[str, int] = {}  # each session's latest turn sent
    for number, line in lines:
        try:
            event = decode_event(line)
        except msgspec.DecodeError as e:
            if not line.endswith(b"\n"):
                break  # the last line of a killed run, cut off: the turns before it still count
            bad.reject(TraceProblem("field", number, f"corrupt line ({e})"))
            continue
        if isinstance(event, SessionPlanned):
            planned[event.session] = (event.role, len(event.schedule))
        elif isinstance(event, RequestSent) and event.turn > last_turn.get(event.session, 0):
            # A turn is due at its first send: a retry, or a send again after an outage, is the same turn.
            last_turn[event.session] = event.turn
            role, turns = planned.get(event.session, ("ramp", 0))
            sent = _Sent(event, number, role, turns, output_default)
            waiting.append(sent)
            by_turn[(event.session, event.turn)] = sent
        elif isinstance(event, TurnDone):
            sent_turn = by_turn.pop((event.session, event.turn), None)
            if sent_turn is not None:
                sent_turn.input_length = event.prompt_tokens or sent_turn.input_length
                sent_turn.output_length = event.completion_tokens or sent_turn.output_length
                sent_turn.resolved = True
        while waiting and waiting[0].resolved:
            yield waiting.popleft().row()
    for sent_turn in waiting:
        yield sent_turn.row()


def _header(path: Path, first: tuple[int, bytes] | None) -> Header:
    """The recording's header, checked as the recording reader checks it (a recording, of a schema this
    rampwatch reads); a TraceProblem that ends the reading otherwise."""
    if first is None:
        raise TraceProblem("format", 1, "empty file, not a recording")
    number, line = first
    try:
        raw = msgspec.json.decode(line)
    except msgspec.DecodeError:
        raw = None
    if not isinstance(raw, dict) or raw.get("type") != "header":
        raise TraceProblem("format", number, "not a rampwatch recording (its first line is no header)")
    schema = raw.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA:
        raise TraceProblem(
            "format",
            number,
            f"a recording of schema {schema}; this rampwatch reads schema {SCHEMA}",
            "upgrade rampwatch",
        )
    try:
        return _header_decoder.decode(line)
    except msgspec.DecodeError as e:
        raise TraceProblem("format", number, f"bad header: {e}") from None
