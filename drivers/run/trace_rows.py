"""The formats with one request a row: Mooncake JSONL (AIPerf's session_id, delay and text_input included) and
Qwen-Bailian CSV or JSONL. Each row becomes a TraceRow as it is read; a row that cannot be one is refused
through BadRows (raised, or counted and skipped)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from rampwatch.drivers.model.trace import BadRows, TraceProblem, tokens_for_text
from rampwatch.drivers.model.trace_sessions import TraceRow
from rampwatch.drivers.run.trace_file import decode, first_line, numbered_lines, open_binary

_ONE_FORMAT = "a trace is one format"


class _MooncakeRow(msgspec.Struct):
    input_length: int | None = None
    output_length: int | None = None
    timestamp: float | None = None  # ms from the trace's start
    hash_ids: list[int] | None = None
    session_id: str | int | None = None
    delay: float | None = None  # ms after the session's previous turn
    text_input: str | None = None
    # Another format's marks: a row that has one is of that format, not a Mooncake row missing its fields.
    chat_id: Any = None
    turns: Any = None
    requests: Any = None
    type: Any = None


class _BailianRow(msgspec.Struct):
    chat_id: int | str | None = None
    parent_chat_id: int | str | None = None
    timestamp: float | None = None  # seconds
    input_length: int | None = None
    output_length: int | None = None
    type: str = ""
    turn: int | None = None
    hash_ids: list[int] | None = None
    turns: Any = None  # another format's marks, as in _MooncakeRow
    requests: Any = None


def _rows(path: Path, bad: BadRows, decode_row: Any) -> Iterator[TraceRow]:
    for number, line in numbered_lines(path):
        try:
            row = decode_row(number, line)
        except TraceProblem as problem:
            bad.reject(problem)
            continue
        yield row


def mooncake_rows(path: Path, bad: BadRows, block_size: int) -> Iterator[TraceRow]:
    return _rows(path, bad, _mooncake_row)


def _mooncake_row(number: int, line: bytes) -> TraceRow:
    r = decode(line, _MooncakeRow, number, "Mooncake row")
    if r.chat_id is not None:
        raise TraceProblem("format", number, "a Qwen-Bailian row (it has chat_id) in a Mooncake trace", _ONE_FORMAT)
    if r.turns is not None or r.requests is not None:
        which = "an AIPerf multi_turn session (it has turns)" if r.turns is not None else "an agentic conversation"
        raise TraceProblem("format", number, f"{which} in a Mooncake trace", _ONE_FORMAT)
    if r.type is not None and r.input_length is None:
        raise TraceProblem("format", number, "a rampwatch recording's line in a Mooncake trace", _ONE_FORMAT)
    text = r.text_input
    input_length = r.input_length if r.input_length is not None else tokens_for_text(text) if text else None
    if input_length is None:
        raise TraceProblem("field", number, "no input_length (nor text_input)")
    if r.output_length is None:
        raise TraceProblem("field", number, "no output_length")
    if r.hash_ids is None and text is None:
        raise TraceProblem("field", number, "no hash_ids (nor text_input)")
    if r.timestamp is None and (r.session_id is None or r.delay is None):
        raise TraceProblem("field", number, "no timestamp (a later turn of a session may give a delay instead)")
    return TraceRow(
        line=number,
        input_length=input_length,
        output_length=r.output_length,
        hash_ids=r.hash_ids,
        due_s=None if r.timestamp is None else r.timestamp / 1000,
        delay_s=None if r.delay is None else r.delay / 1000,
        sets_clock=r.timestamp is not None,
        session_key=None if r.session_id is None else str(r.session_id),
        text=text,
    )


def bailian_rows(path: Path, bad: BadRows, block_size: int) -> Iterator[TraceRow]:
    """CSV (a header row, then one row a request) or JSONL (one object a line), told by the first line."""
    first = first_line(path)
    if first is not None and first[1].lstrip().startswith(b"{"):
        return _rows(path, bad, _bailian_json_row)
    return _bailian_csv_rows(path, bad)


def _bailian_json_row(number: int, line: bytes) -> TraceRow:
    r = decode(line, _BailianRow, number, "Qwen-Bailian row")
    if r.chat_id is None:
        which = (
            "an AIPerf multi_turn session (it has turns)"
            if r.turns is not None
            else "an agentic conversation (it has requests)"
            if r.requests is not None
            else "a row without chat_id (Mooncake?)"
        )
        raise TraceProblem("format", number, f"{which} in a Qwen-Bailian trace", _ONE_FORMAT)
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if getattr(r, name) is None:
            raise TraceProblem("field", number, f"no {name}")
    assert r.timestamp is not None and r.input_length is not None and r.output_length is not None
    return _bailian_row(
        number, r.chat_id, r.parent_chat_id, r.timestamp, r.input_length, r.output_length, r.type, r.hash_ids
    )


def _bailian_row(
    number: int,
    chat: int | str,
    parent: int | str | None,
    timestamp: float,
    input_length: int,
    output_length: int,
    kind: str,
    hash_ids: list[int] | None,
) -> TraceRow:
    parent_id = None if parent is None or str(parent).strip() in ("", "-1") else str(parent).strip()
    return TraceRow(
        line=number,
        input_length=input_length,
        output_length=output_length,
        hash_ids=hash_ids,
        due_s=timestamp,
        sets_clock=True,
        row_id=str(chat).strip(),
        parent_id=parent_id,
        kind=kind,
    )


_CSV_NEEDS = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids")
# A cell may hold a long prompt's hash ids (a 1M-token prompt is 62,500 16-token ids, ~500 KB); csv's default
# limit is 128 KB.
CSV_CELL_MAX = 1 << 26


def _bailian_csv_rows(path: Path, bad: BadRows) -> Iterator[TraceRow]:
    csv.field_size_limit(max(csv.field_size_limit(), CSV_CELL_MAX))
    with open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as text:
        reader = csv.reader(text)
        lines = _csv_lines(reader, bad)
        header = next((cells for cells in lines if any(c.strip() for c in cells)), None)
        if header is None:
            return
        columns = {name.strip(): i for i, name in enumerate(header)}
        missing = [name for name in _CSV_NEEDS if name not in columns]
        if missing:
            raise TraceProblem(
                "format",
                reader.line_num,
                f"not a Qwen-Bailian CSV header: no {', '.join(missing)} column",
                "the header names chat_id,parent_chat_id,timestamp,input_length,output_length,type,turn,hash_ids",
            )
        for cells in lines:
            if not any(c.strip() for c in cells):
                continue
            try:
                row = _bailian_csv_row(cells, columns, reader.line_num)
            except TraceProblem as problem:
                bad.reject(problem)
                continue
            yield row


def _csv_lines(reader: Any, bad: BadRows) -> Iterator[list[str]]:
    """The reader's rows; a line csv cannot read (a cell over CSV_CELL_MAX, a NUL) is a bad row."""
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            bad.reject(TraceProblem("field", reader.line_num, f"not a CSV row ({e})"))
            continue
        yield cells


def _bailian_csv_row(cells: list[str], columns: dict[str, int], number: int) -> TraceRow:
    def cell(name: str) -> str:
        i = columns.get(name)
        return cells[i].strip() if i is not None and i < len(cells) else ""

    def number_in(name: str, parse: type[int] | type[float]) -> Any:
        value = cell(name)
        try:
            return parse(value)
        except ValueError:
            raise TraceProblem("field", number, f"{name} is not a number: {value!r}") from None

    return _bailian_row(
        number,
        cell("chat_id"),
        cell("parent_chat_id"),
        number_in("timestamp", float),
        number_in("input_length", int),
        number_in("output_length", int),
        cell("type"),
        _hash_ids_cell(cell("hash_ids"), number),
    )


def _hash_ids_cell(text: str, number: int) -> list[int]:
    """A JSON list of ints ("[1, 2, 3]"); an empty cell is no blocks."""
    if not text:
        return []
    try:
        ids = msgspec.json.decode(text, type=list[int])
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise TraceProblem("field", number, f"hash_ids is not a list of ids: {text[:40]!r}") from None
    return ids
