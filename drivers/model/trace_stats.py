"""`rampwatch trace info`'s figures, folded from a trace's requests as they stream (in due order, with their
ideal reuse set): sessions and turns, requests per minute, the context sizes, growth per turn, the ideal hit
rates and the peak concurrent live context.

The peak live context is the KV a server must hold to keep every live session's prefix. A session is live
from its first request's due time to its last's, and holds its latest request's context (input_length +
output_length: the prompt and the reply the next turn extends) until its next request. A trace gives no
request durations, so a one-turn session counts at its due instant only. Percentiles come from every sample
(drivers/model/stats.py), never from a histogram; what is kept per request is one number or two in a flat
array, and per session only while it is open.
"""

from __future__ import annotations

import math
from array import array

import msgspec

from rampwatch.drivers.model.stats import quantile
from rampwatch.drivers.model.trace import TraceRequest


class Spread(msgspec.Struct, kw_only=True):
    p50: float
    p99: float | None = None
    max: float


class TraceInfo(msgspec.Struct, kw_only=True):
    """A trace's figures; `rampwatch trace info --json` writes exactly this."""

    path: str = ""
    format: str = ""
    block_size: int = 0
    kv_tokens: int | None = None  # --kv-tokens: the LRU pool the second ideal hit rate assumes
    sessions: int = 0
    forked_sessions: int = 0  # sessions that fork from another's prefix (branches, subagents)
    requests: int = 0
    turns_per_session: Spread | None = None
    span_s: float = 0.0  # first request's due time to the last's
    requests_per_minute: list[int] = []  # per minute from the first request
    context_tokens: Spread | None = None  # input_length of every request
    growth_per_turn: Spread | None = None  # input_length minus the session's previous turn's (turns 2 on)
    prompt_tokens: int = 0
    ideal_cached: int = 0
    ideal_hit_rate: float | None = None  # ideal_cached / prompt_tokens, unbounded
    ideal_cached_pool: int | None = None
    ideal_hit_rate_pool: float | None = None  # ... with an LRU pool of kv_tokens
    peak_live_tokens: int = 0
    peak_live_at_s: float | None = None
    peak_live_sessions: int = 0
    skipped: dict[str, int] = {}  # requests or rows left out, by reason (bad input and the slice)
    stopped_at_duration: bool = False  # the slice's duration ended the reading


# The picture's bins (seconds): the first of these that puts the trace's time in at most MAX_BINS of them.
BIN_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_BINS = 60  # as the text's line of marks: at most 60


class TraceCurves(msgspec.Struct, kw_only=True):
    """A trace over its time (`trace info --svg`), in equal bins from its first request: the requests per minute
    in each bin, and the most live context at any due instant in it (the peak live context's count; None in a
    bin where nothing is due)."""

    bin_s: float
    requests_per_minute: list[float]
    live_tokens: list[int | None]


class _Open:
    """A session between its first request and its last: what the fold still needs of it."""

    __slots__ = ("held", "instant", "last_input", "turns")

    def __init__(self) -> None:
        self.instant, self.held, self.last_input, self.turns = 0, 0, 0, 0


class TraceStats:
    """Folds requests, in due order, into a TraceInfo."""

    def __init__(self) -> None:
        self._open: dict[str, _Open] = {}
        self._contexts = array("q")
        self._growth = array("q")
        self._turns = array("q")
        self._minutes: list[int] = []
        # The live context as a difference array over the distinct due instants: one slot more than instants.
        self._instants = array("d")
        self._live_tokens = array("q", [0])
        self._live_sessions = array("q", [0])
        self._arrivals = array("q", [0])  # requests due at each instant
        self._first_due: float | None = None
        self._last_due = 0.0
        self.sessions = self.forked = self.requests = 0
        self.prompt_tokens = self.ideal_cached = 0
        self.ideal_cached_pool: int | None = None

    def add(self, r: TraceRequest) -> None:
        self.requests += 1
        self._contexts.append(r.input_length)
        self.prompt_tokens += r.input_length
        self.ideal_cached += r.ideal_cached or 0
        if r.ideal_cached_pool is not None:
            self.ideal_cached_pool = (self.ideal_cached_pool or 0) + r.ideal_cached_pool
        self._count_minute(r.due_s)
        i = self._instant(r.due_s)
        self._arrivals[i] += 1
        s = self._open.get(r.session)
        if s is None:
            s = self._open[r.session] = _Open()
            self.sessions += 1
            self.forked += r.forked_from is not None
        else:
            self._growth.append(r.input_length - s.last_input)
            self._hold(s.instant, i, s.held)
        held = r.input_length + r.output_length
        self._span(i, i + 1, held, 1)
        s.instant, s.held, s.last_input = i, held, r.input_length
        s.turns += 1
        if r.closes_session:
            self._turns.append(s.turns)
            del self._open[r.session]

    def _count_minute(self, due_s: float) -> None:
        if self._first_due is None:
            self._first_due = due_s
        self._last_due = due_s
        minute = int((due_s - self._first_due) // 60)
        while len(self._minutes) <= minute:
            self._minutes.append(0)
        self._minutes[minute] += 1

    def _instant(self, due_s: float) -> int:
        if not self._instants or due_s > self._instants[-1]:
            self._instants.append(due_s)
            self._live_tokens.append(0)
            self._live_sessions.append(0)
            self._arrivals.append(0)
        return len(self._instants) - 1

    def _span(self, start: int, end: int, tokens: int, sessions: int) -> None:
        """Add `tokens` held by `sessions` over instants [start, end)."""
        self._live_tokens[start] += tokens
        self._live_tokens[end] -= tokens
        self._live_sessions[start] += sessions
        self._live_sessions[end] -= sessions

    def _hold(self, was: int, now: int, held: int) -> None:
        """A session's previous request at instant `was` held its context until `now`, where a later one takes
        over: it counted at `was` alone so far; it now spans the instants between too (or, at the same instant,
        gives way to the later request)."""
        if was < now:
            self._span(was + 1, now, held, 1)
        else:
            self._span(now, now + 1, -held, -1)

    def finish(self, **known: object) -> TraceInfo:
        """The figures; `known` fills what the stream cannot know (path, format, block_size, kv_tokens,
        skipped, stopped_at_duration)."""
        turns = array("q", self._turns)
        turns.extend(s.turns for s in self._open.values())
        peak, at, live = self._peak()
        info = TraceInfo(
            sessions=self.sessions,
            forked_sessions=self.forked,
            requests=self.requests,
            turns_per_session=_spread(turns, p99=False),
            span_s=self._last_due - (self._first_due or 0.0),
            requests_per_minute=list(self._minutes),
            context_tokens=_spread(self._contexts, p99=True),
            growth_per_turn=_spread(self._growth, p99=False),
            prompt_tokens=self.prompt_tokens,
            ideal_cached=self.ideal_cached,
            ideal_hit_rate=_share(self.ideal_cached, self.prompt_tokens),
            ideal_cached_pool=self.ideal_cached_pool,
            ideal_hit_rate_pool=None
            if self.ideal_cached_pool is None
            else _share(self.ideal_cached_pool, self.prompt_tokens),
            peak_live_tokens=peak,
            peak_live_at_s=at,
            peak_live_sessions=live,
        )
        for name, value in known.items():
            setattr(info, name, value)
        return info

    def curves(self, max_bins: int = MAX_BINS) -> TraceCurves:
        """The requests per minute and the live context, each bin of the trace's time."""
        first = self._first_due or 0.0
        span = self._last_due - first
        bin_s = float(next((b for b in BIN_STEPS_S if span / b < max_bins), math.ceil(span / max_bins)))
        bins = int(span // bin_s) + 1
        arrivals = [0] * bins
        live: list[int | None] = [None] * bins
        tokens = 0
        for i, t in enumerate(self._instants):
            b = min(bins - 1, int((t - first) // bin_s))
            tokens += self._live_tokens[i]
            arrivals[b] += self._arrivals[i]
            live[b] = max(live[b] or 0, tokens)
        return TraceCurves(bin_s=bin_s, requests_per_minute=[n * 60 / bin_s for n in arrivals], live_tokens=live)

    def _peak(self) -> tuple[int, float | None, int]:
        """The most live context at any instant, when (the first such instant), and how many sessions held it."""
        best, at, live = 0, None, 0
        tokens = sessions = 0
        for i, t in enumerate(self._instants):
            tokens += self._live_tokens[i]
            sessions += self._live_sessions[i]
            if tokens > best:
                best, at, live = tokens, t, sessions
        return best, at, live


def _spread(samples: array, p99: bool) -> Spread | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return Spread(p50=quantile(ordered, 0.5), p99=quantile(ordered, 0.99) if p99 else None, max=ordered[-1])


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None
