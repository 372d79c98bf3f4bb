"""A rampwatch recording read as a trace: the same sessions, each turn due when it was first sent (a retry is the
same turn; a demo's times as modelled, its wall clock times its time scale), its context the prompt tokens the
server reported, its output the completion tokens. A turn's sizes are its first TurnDone's, so turns wait in send
order until theirs has come; what waits is the turns in flight, never the file. A turn the server reported no
sizes for (failed, or never finished in a killed run) keeps the size it was sent at and the run's output budget.

A recording of a trace replay (--trace) is read at that trace's block size, and its turns take the hash ids of
the requests they replayed (drivers/model/trace_replayed.py) when `replayed` can read that trace again; other
recordings' ids are derived."""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from rampwatch.drivers.model.events import SCHEMA, Header, RequestSent, SessionPlanned, TraceRun, TurnDone
from rampwatch.drivers.model.modelled import time_factor
from rampwatch.drivers.model.trace import BLOCK_SIZES, BadRows, TraceProblem, TraceRequest
from rampwatch.drivers.model.trace_replayed import ReplayedBlocks
from rampwatch.drivers.model.trace_sessions import TraceRow
from rampwatch.drivers.run.recording import decode_event
from rampwatch.drivers.run.trace_file import first_line, numbered_lines

_header_decoder = msgspec.json.Decoder(Header)

# Reads the trace a recorded run replayed again, cut as the run cut it; None where it cannot (not there).
Replayed = Callable[[TraceRun], Iterator[TraceRequest] | None]


def recording_block_size(path: Path) -> int:
    """The block size a recording is read at by default: the trace's it replayed, or derived ids' 16."""
    try:
        header = _header(path, first_line(path))
    except (TraceProblem, OSError, EOFError, zlib.error):
        return BLOCK_SIZES["rampwatch"]  # the reading itself says what is wrong
    return header.trace.block_size if header.trace is not None else BLOCK_SIZES["rampwatch"]


class _Sent:
    """A turn sent and not yet resolved to the sizes it had."""

    __slots__ = ("input_length", "kind", "line", "output_length", "planned", "resolved", "session", "t", "turn")

    def __init__(self, e: RequestSent, line: int, kind: str, planned: int, output_length: int, k: float):
        self.session, self.turn, self.t, self.line, self.kind = e.session, e.turn, e.t * k, line, kind
        self.planned = planned
        self.input_length = e.target_tokens
        self.output_length = output_length
        self.resolved = False

    def row(self, blocks: ReplayedBlocks | None) -> TraceRow:
        return TraceRow(
            line=self.line,
            input_length=self.input_length,
            hash_ids=None if blocks is None else blocks.hash_ids(self.session, self.turn, self.input_length),
            output_length=self.output_length,
            due_s=self.t,
            sets_clock=True,
            session_key=self.session,
            kind=self.kind,
            closes_session=self.turn == self.planned,
        )


def recording_rows(path: Path, bad: BadRows, block_size: int, replayed: Replayed | None = None) -> Iterator[TraceRow]:
    lines = numbered_lines(path)
    header = _header(path, next(lines, None))
    output_default = header.max_tokens or header.output_tokens or 1
    k = time_factor(header)
    blocks = _replayed_blocks(header.trace, block_size, replayed)
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
            sent = _Sent(event, number, role, turns, output_default, k)
            waiting.append(sent)
            by_turn[(event.session, event.turn)] = sent
        elif isinstance(event, TurnDone):
            sent_turn = by_turn.pop((event.session, event.turn), None)
            if sent_turn is not None:
                sent_turn.input_length = event.prompt_tokens or sent_turn.input_length
                sent_turn.output_length = event.completion_tokens or sent_turn.output_length
                sent_turn.resolved = True
        while waiting and waiting[0].resolved:
            yield waiting.popleft().row(blocks)
    for sent_turn in waiting:
        yield sent_turn.row(blocks)


def _replayed_blocks(run: TraceRun | None, block_size: int, replayed: Replayed | None) -> ReplayedBlocks | None:
    """The replayed trace's ids, where the recording replayed one and is read at its block size."""
    if run is None or replayed is None or block_size != run.block_size:
        return None
    requests = replayed(run)
    return None if requests is None else ReplayedBlocks(requests, block_size)


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
