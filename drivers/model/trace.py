"""A trace: a stream of requests in due order, each a turn of a session, its prompt made of hash-id blocks.

Every format (Mooncake, Qwen-Bailian, agentic, AIPerf multi_turn, a rampwatch recording) is read into these
(drivers/run/trace_read.py); everything after the reading (sessions, slicing, ideal reuse, `trace info`'s
figures) is computed on them here, pure, with no file in sight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec

TRACE_FORMATS = ("mooncake", "bailian", "agentic", "aiperf", "rampwatch")

# Tokens per hash id, as each format defines its blocks. AIPerf multi_turn and a recording carry no hash ids:
# theirs are derived (derived_hash_ids), in 16-token blocks, vLLM's default, so the ideal is what a prefix cache
# of that granularity could reuse.
BLOCK_SIZES = {"mooncake": 512, "bailian": 16, "agentic": 64, "aiperf": 16, "rampwatch": 16}

# Derived hash ids: a session's ordinal in the high bits, so no two sessions ever share a derived block.
_DERIVED_SPAN = 1 << 40

# A turn given as text and no length counts this many characters a token until a server counts it.
TEXT_CHARS_PER_TOKEN = 4


class TraceRequest(msgspec.Struct, kw_only=True):
    """One request of a trace: turn `turn` of session `session`, due `due_s` seconds from the trace's start."""

    session: str
    turn: int  # 1-based, contiguous within its session
    due_s: float
    input_length: int  # prompt tokens (the whole context, not the turn's new text)
    output_length: int
    hash_ids: Sequence[int]  # the prompt's blocks in prefix order, block_size tokens each; the last may be partial
    kind: str = ""  # the format's `type` (text, image, subagent, ...), where it has one
    text: str | None = None  # the prompt (or its new message) as written, where the trace carries one
    line: int = 0  # the line of the file it was read from (1-based)
    forked_from: str | None = None  # on a session's first turn: the session whose prefix it shares
    fork_turn: int = 0  # ... forked after that session's turn `fork_turn`
    closes_session: bool = False  # known to be its session's last turn (False: not known, or not the last)
    ideal_cached: int | None = None  # the ideal reuse with an unbounded cache (trace_reuse.annotate_ideal)
    ideal_cached_pool: int | None = None  # ... with an LRU pool of the tokens asked for (None: no pool asked)


class TraceSession(msgspec.Struct, kw_only=True):
    """A session's turns in order, and the session it forked from."""

    id: str
    turns: list[TraceRequest]
    forked_from: str | None = None
    fork_turn: int = 0


def collect_sessions(requests: Iterable[TraceRequest]) -> list[TraceSession]:
    """The sessions of a stream of requests, in the order they start; for a trace small enough to hold whole."""
    sessions: dict[str, TraceSession] = {}
    for r in requests:
        s = sessions.get(r.session)
        if s is None:
            s = sessions[r.session] = TraceSession(id=r.session, turns=[], forked_from=r.forked_from)
            s.fork_turn = r.fork_turn
        s.turns.append(r)
    return list(sessions.values())


def blocks_for(input_length: int, block_size: int) -> int:
    """How many hash ids a prompt of `input_length` tokens has: its full blocks and a partial last one."""
    return math.ceil(input_length / block_size)


def tokens_for_text(text: str) -> int:
    """A text's length in tokens as a trace without lengths is read: one per TEXT_CHARS_PER_TOKEN characters."""
    return math.ceil(len(text) / TEXT_CHARS_PER_TOKEN)


def derived_hash_ids(session_ordinal: int, input_length: int, block_size: int) -> range:
    """Hash ids for a format that has none: block k of a session is the same id in every turn of that session
    and in no other session, so a session's turns share its growing prefix and nothing else does."""
    base = session_ordinal * _DERIVED_SPAN
    return range(base, base + blocks_for(input_length, block_size))


# Why a row was refused, by the key the skip counts use; the words finish "skipped: N ...".
REASONS = {
    "field": "with a missing or malformed field",
    "format": "of another format (mixed formats)",
    "order": "with timestamps out of order",
    "length": "with a negative or zero length",
    "hash-ids": "whose hash ids disagree with input_length",
    "parent": "whose parent never appears",
    "cycle": "in a session that cycles",
    "duplicate": "that reuse a session or chat id",
}


class TraceProblem(Exception):
    """A row of a trace that cannot be used: why (a key of REASONS), where, and the fix where there is one.
    The reader names the file; `str()` is the rest of the one line the user reads."""

    def __init__(self, reason: str, line: int, message: str, fix: str = "", item: int = 0):
        super().__init__(message)
        self.reason, self.line, self.message, self.fix, self.item = reason, line, message, fix, item

    def __str__(self) -> str:
        where = f"line {self.line}" + (f" (request {self.item})" if self.item else "")
        return f"{where}: {self.message}" + (f"; {self.fix}" if self.fix else "")


class BadRows:
    """What to do with a row that cannot be used: stop (raise it), or skip it and count it by reason."""

    def __init__(self, skip: bool = False):
        self.skip = skip
        self.counts: dict[str, int] = {}

    def reject(self, problem: TraceProblem) -> None:
        if not self.skip:
            raise problem
        self.counts[problem.reason] = self.counts.get(problem.reason, 0) + 1

    @property
    def skipped(self) -> int:
        return sum(self.counts.values())


def check_positive(input_length: int, output_length: int, line: int, item: int = 0) -> None:
    """A request has at least one token each way; TraceProblem otherwise."""
    if input_length <= 0 or output_length <= 0:
        which, value = ("input_length", input_length) if input_length <= 0 else ("output_length", output_length)
        raise TraceProblem("length", line, f"{which} is {value}; a request has at least one token each way", item=item)


def check_hash_ids(input_length: int, hash_ids: Sequence[int], block_size: int, line: int, item: int = 0) -> None:
    """The hash ids cover the prompt, `block_size` tokens each (the last block may be partial); TraceProblem
    otherwise."""
    want = blocks_for(input_length, block_size)
    if len(hash_ids) != want:
        raise TraceProblem(
            "hash-ids",
            line,
            f"{len(hash_ids)} hash ids for input_length {input_length}, which at {block_size} tokens a block "
            f"needs {want}",
            fix="check --block-size (or the row)",
            item=item,
        )
