"""A trace file's lines, read as a stream (gzip or not), and the JSON decoding every format shares: a line that
does not decode is a TraceProblem naming the line, never a traceback."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import msgspec

from rampwatch.drivers.model.trace import TraceProblem

T = TypeVar("T")

_GZIP_MAGIC = b"\x1f\x8b"


def open_binary(path: Path) -> IO[bytes]:
    """The file's bytes, through gzip when it is compressed (told by its first two bytes, not its name)."""
    f = open(path, "rb")  # handed to the caller, who closes it
    if f.read(2) == _GZIP_MAGIC:
        f.close()
        return gzip.open(path, "rb")
    f.seek(0)
    return f


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every line that is not blank; one line in memory at a time."""
    with open_binary(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield number, line


def first_line(path: Path) -> tuple[int, bytes] | None:
    return next(numbered_lines(path), None)


def decode(line: bytes, kind: type[T], number: int, what: str) -> T:
    """One line decoded as `kind`; a TraceProblem ("field") saying what is wrong otherwise."""
    try:
        return msgspec.json.decode(line, type=kind)
    except msgspec.ValidationError as e:
        raise TraceProblem("field", number, f"not a {what}: {e}") from None
    except msgspec.DecodeError as e:
        raise TraceProblem("field", number, f"not JSON ({e})") from None


def json_object(line: bytes) -> dict[str, Any] | None:
    """The line as a JSON object, or None when it is not one."""
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None
