"""What one session looks like to the panels: where it is, its decode rate now, its timeline; and the
summaries over every session (the Sessions panel's line, the prefills in flight)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.ttft_split import WaitPart
from rampwatch.drivers.model.turns import TurnRecord, decode_tok_s, hit_rate, ideal_hit_rate

# reasoning: generating, but the answer has not started (a reasoning model's thinking); decoding: answering.
# "user idle": the user's own pause (--think-time) before the next turn, not the model's.
SessionState = Literal[
    "queued", "prefilling", "reasoning", "decoding", "idle", "user idle", "failed", "done", "cancelled"
]
GENERATING: tuple[SessionState, ...] = ("reasoning", "decoding")  # tokens are streaming: a decode rate applies
NO_ANSWER = "no answer"  # a turn's needle mark when the reply was cut before any answer

DECODE_WINDOW_S = 2.0  # "current" decode rate looks this far back
TIMELINE_BUCKET_S = 1.0
TIMELINE_LEN = 1800  # seconds kept per session for the chart; the recording keeps all


class RecentTimes:
    """Arrival times (in time order) within the last `window` seconds of the latest: a list cut by bisection, so
    a batch of chunks costs the fold C-speed steps (a deque popped a time at a time was a Python step a chunk)."""

    __slots__ = ("_times", "_start", "window")

    def __init__(self, window: float = DECODE_WINDOW_S):
        self._times: list[float] = []
        self._start = 0  # the window's first time: _times[_start:]
        self.window = window

    def extend(self, times: list[float]) -> None:
        held = self._times
        held.extend(times)
        self._start = cut = bisect_left(held, times[-1] - self.window, self._start)
        if cut > 1024 and 2 * cut > len(held):  # drop the times behind the window: amortised O(1) a time
            del held[:cut]
            self._start = 0

    def clear(self) -> None:
        self._times.clear()
        self._start = 0

    def __len__(self) -> int:
        return len(self._times) - self._start

    @property
    def first(self) -> float:
        return self._times[self._start]

    @property
    def last(self) -> float:
        return self._times[-1]


@dataclass(slots=True)
class SessionsAggregate:
    """The Sessions panel's one-line summary, over every session."""

    total: int
    by_state: dict[str, int]
    ttft_p50: float | None  # of each session's last finished turn
    ttft_max: float | None
    decode_p50: float | None  # of the sessions decoding now
    decode_min: float | None
    # Open loop (--arrivals): conversations arrived so far, live now, waiting to start (None: closed loop).
    arrivals: tuple[int, int, int] | None = None


@dataclass(slots=True)
class PrefillProgress:
    session: str
    turn: int
    new_tokens: int
    elapsed: float
    expected: float | None  # seconds, from the last prefill rate seen

    @property
    def fraction(self) -> float | None:
        return min(0.99, self.elapsed / self.expected) if self.expected else None


@dataclass(slots=True)
class SessionView:
    """One session as the Sessions panel shows it: where it is and how it is doing."""

    id: str
    schedule: list[int]
    role: ev.SessionRole = "ramp"
    order: int = 0  # 1-based among the ramp sessions in the order they were planned (arrived); 0: not one
    state: SessionState = "queued"
    turn: int = 0
    current: TurnRecord | None = None
    last_done: TurnRecord | None = None
    last_prompt_tokens: int | None = None  # the last reported prompt, so the next turn knows its new tokens
    tokens_per_chunk: float = 1.0  # from the last finished turn's usage: turns chunk counts into tokens
    needles: list[bool | str | None] = field(default_factory=list)  # found, missed, NO_ANSWER or not asked
    recent: RecentTimes = field(default_factory=RecentTimes)  # arrival times inside the decode window
    # Text chunks per TIMELINE_BUCKET_S: timeline[i] is bucket timeline_first + i (a flat list the chart slices).
    timeline: list[int] = field(default_factory=list)
    timeline_first: int = 0
    prefill_spans: deque[list[float | None]] = field(default_factory=lambda: deque(maxlen=64))  # [sent, first|None]
    # The parts of its recent turns' waits the engine timed, (part, start, end) in time order (turns.wait_parts).
    waits: deque[tuple[WaitPart, float, float]] = field(default_factory=lambda: deque(maxlen=3 * 64))
    failed_turns: int = 0
    endpoint: str = ""  # the name of the server its turns go to
    pause: ev.UserPause | None = None  # the user's latest pause (--think-time)
    arrival: float | None = None  # open loop: when the conversation arrived
    worker: int | None = None  # the driver worker it ran on (--workers N, --cluster, shards); None: the one driver
    # Behind a router: each finished turn's backend where one is known (backends.py), and how often it moved.
    backends: dict[int, str] = field(default_factory=dict)
    moves: int = 0

    @property
    def waiting(self) -> bool:
        """Arrived (open loop) but not yet started: its first turn is not sent (a --max-live slot, or building)."""
        return self.arrival is not None and self.state == "queued"

    def user_idle(self, now: float) -> float | None:
        """Seconds the user has paused so far, while the session is in its pause."""
        return max(0.0, now - self.pause.t) if self.state == "user idle" and self.pause is not None else None

    @property
    def context_tokens(self) -> int | None:
        rec = self.current or self.last_done
        return None if rec is None else rec.context_tokens

    @property
    def hit_rate(self) -> float | None:
        """The last finished turn's prefix-cache hit rate (turns.hit_rate: the report's `hit` of that turn; none
        when it did not finish ok)."""
        return None if self.last_done is None else hit_rate(self.last_done)

    def add_waits(self, parts: list[tuple[WaitPart, float, float]]) -> None:
        """A timed turn's wait parts, kept in time order (a late span's turn may have ended before the newest)."""
        waits = self.waits
        late = bool(waits) and bool(parts) and waits[-1][2] > parts[0][1]
        waits.extend(parts)
        if late:
            ordered = sorted(waits, key=lambda p: p[1])
            waits.clear()
            waits.extend(ordered)

    def prefills_overlapping(self, lo: float, hi: float) -> list[tuple[float, float | None]]:
        """The session's prefill spans that overlap [lo, hi], newest first; spans are in time order, so the scan
        stops at the first one that ended before `lo`."""
        out = []
        for a, b in reversed(self.prefill_spans):
            if b is not None and b <= lo:
                break
            if a <= hi:
                out.append((a, b))
        return out

    @property
    def ideal_hit_rate(self) -> float | None:
        """--trace: what the trace allowed the last finished turn's hit rate to be (turns.ideal_hit_rate)."""
        return None if self.last_done is None else ideal_hit_rate(self.last_done)

    def current_gap(self, now: float) -> float | None:
        """While generating: seconds since the last text chunk arrived (a stall, when long)."""
        rec = self.current
        if self.state not in GENERATING or rec is None or rec.last_t is None:
            return None
        return max(0.0, now - rec.last_t)

    def wait_cells(self, start: float, step: float, n: int) -> list[WaitPart | None]:
        """For n time cells of `step` seconds from `start`: the part of a timed wait that covers most of each
        (None: no timed wait there). Newest first, so the scan stops at the first part that ended before `start`."""
        cover: list[dict[WaitPart, float]] = [{} for _ in range(n)]
        for part, a, b in reversed(self.waits):
            if b <= start:
                break
            first, last = max(0, int((a - start) // step)), min(n - 1, math.ceil((b - start) / step) - 1)
            for i in range(first, last + 1):
                lo = start + i * step
                cover[i][part] = cover[i].get(part, 0.0) + min(b, lo + step) - max(a, lo)
        return [max(c, key=c.__getitem__) if c else None for c in cover]

    def decode_rate_now(self) -> float | None:
        """Decode tokens/s over the last DECODE_WINDOW_S (chunks scaled to tokens)."""
        r = self.recent
        return decode_tok_s(len(r) * self.tokens_per_chunk, r.first, r.last) if len(r) else None

    def timeline_values(self, first_bucket: int, n: int) -> list[float]:
        """Decode tokens/s in each of n buckets from `first_bucket` (0 where nothing arrived)."""
        counts, base = self.timeline, self.timeline_first
        lo, hi = max(0, first_bucket - base), max(0, first_bucket + n - base)
        scale = self.tokens_per_chunk / TIMELINE_BUCKET_S
        values = [c * scale for c in counts[lo:hi]]
        pad = min(n, max(0, base - first_bucket))
        return [0.0] * pad + values + [0.0] * (n - pad - len(values))

    def chunks_arrived(self, times: list[float]) -> None:
        """Text chunks that arrived (in time order): the decode window's and the timeline's. A batch is counted
        a bucket at a time (bisected at each bucket's end), not a chunk at a time: a read of a fast stream carries
        thousands."""
        self.recent.extend(times)
        counts = self.timeline
        if not counts:
            self.timeline_first = int(times[0] // TIMELINE_BUCKET_S)
        first, last = int(times[0] // TIMELINE_BUCKET_S), int(times[-1] // TIMELINE_BUCKET_S)
        if last - self.timeline_first >= len(counts):
            counts.extend([0] * (last - self.timeline_first + 1 - len(counts)))
        lo = 0
        for b in range(first, last + 1):
            hi = len(times) if b == last else bisect_left(times, (b + 1) * TIMELINE_BUCKET_S, lo)
            if b >= self.timeline_first:
                counts[b - self.timeline_first] += hi - lo
            lo = hi
        if len(counts) > 2 * TIMELINE_LEN:  # trim by halves: amortised O(1) per bucket
            drop = len(counts) - TIMELINE_LEN
            del counts[:drop]
            self.timeline_first += drop
