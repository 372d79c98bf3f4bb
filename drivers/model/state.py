"""RunState: folds events into the live picture. Pure: no I/O, no Textual.

`apply` is O(1) per event (O(tokens) for a batch of token times, O(sessions)
per batch for the interference split), so the driver can call it inline.
Widgets and reports read it; they never compute statistics of their own.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.turns import TurnRecord, decode_tok_s, hit_rate, prefill_tok_s, turn_line
from rampwatch.drivers.telemetry.metrics import ENGINE_POOL

SessionState = Literal["queued", "prefilling", "decoding", "idle", "failed", "done", "cancelled"]

DECODE_WINDOW_S = 2.0  # "current" decode rate looks this far back
TIMELINE_BUCKET_S = 1.0
TIMELINE_LEN = 1800  # seconds kept per session for the chart; the recording keeps all
LOG_LEN = 500
HISTORY_LEN = 1800
RATE_WINDOW_S = 10.0  # server throughput is averaged over this long

# Normalized counters (drivers/telemetry/metrics.py) that analysis takes deltas of.
COUNTERS = ("prefix_queries", "prefix_hits", "prompt_tokens", "prompt_computed", "generation_tokens", "preemptions")


class LogEntry(NamedTuple):
    """One line of the run's log; `ttft` marks a finished turn (the events panel groups those)."""

    t: float
    level: str  # info | warn | error | mark
    text: str
    ttft: float | None = None


@dataclass(slots=True)
class SessionsAggregate:
    """The Sessions panel's one-line summary, over every session."""

    total: int
    by_state: dict[str, int]
    ttft_p50: float | None  # of each session's last finished turn
    ttft_max: float | None
    decode_p50: float | None  # of the sessions decoding now
    decode_min: float | None


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
    state: SessionState = "queued"
    turn: int = 0
    current: TurnRecord | None = None
    last_done: TurnRecord | None = None
    last_prompt_tokens: int | None = None  # the last reported prompt, so the next turn knows its new tokens
    tokens_per_chunk: float = 1.0  # from the last finished turn's usage: turns chunk counts into tokens
    needles: list[bool | None] = field(default_factory=list)
    recent: deque[float] = field(default_factory=deque)  # arrival times inside the decode window
    # Text chunks per TIMELINE_BUCKET_S: timeline[i] is bucket timeline_first + i (a flat list the chart slices).
    timeline: list[int] = field(default_factory=list)
    timeline_first: int = 0
    prefill_spans: deque[list[float | None]] = field(default_factory=lambda: deque(maxlen=64))  # [sent, first|None]
    failed_turns: int = 0
    endpoint: str = ""  # the name of the server its turns go to

    @property
    def context_tokens(self) -> int | None:
        rec = self.current or self.last_done
        if rec is None:
            return None
        return rec.prompt_tokens if rec.prompt_tokens is not None else rec.target

    @property
    def cached_share(self) -> float | None:
        """Cached share of the last finished turn's prompt (from usage)."""
        rec = self.last_done
        if rec is None or rec.cached_tokens is None or not rec.prompt_tokens:
            return None
        return rec.cached_tokens / rec.prompt_tokens

    def current_gap(self, now: float) -> float | None:
        """While decoding: seconds since the last text chunk arrived (a stall, when long)."""
        rec = self.current
        if self.state != "decoding" or rec is None or rec.last_t is None:
            return None
        return max(0.0, now - rec.last_t)

    def decode_rate_now(self) -> float | None:
        """Decode tokens/s over the last DECODE_WINDOW_S (chunks scaled to tokens)."""
        r = self.recent
        return decode_tok_s(len(r) * self.tokens_per_chunk, r[0], r[-1]) if r else None

    def timeline_values(self, first_bucket: int, n: int) -> list[float]:
        """Decode tokens/s in each of n buckets from `first_bucket` (0 where nothing arrived)."""
        counts, base = self.timeline, self.timeline_first
        lo, hi = max(0, first_bucket - base), max(0, first_bucket + n - base)
        scale = self.tokens_per_chunk / TIMELINE_BUCKET_S
        values = [c * scale for c in counts[lo:hi]]
        pad = min(n, max(0, base - first_bucket))
        return [0.0] * pad + values + [0.0] * (n - pad - len(values))

    def count_arrivals(self, times: list[float]) -> None:
        counts = self.timeline
        for t in times:
            b = int(t // TIMELINE_BUCKET_S)
            if not counts:
                self.timeline_first = b
            i = b - self.timeline_first
            if i >= len(counts):
                counts.extend([0] * (i + 1 - len(counts)))
            if i >= 0:
                counts[i] += 1
        if len(counts) > 2 * TIMELINE_LEN:  # trim by halves: amortised O(1) per bucket
            drop = len(counts) - TIMELINE_LEN
            del counts[:drop]
            self.timeline_first += drop


class _Rates:
    """Prefill and decode tokens/s from a `rates` dict (an endpoint's, or every endpoint's summed)."""

    __slots__ = ()
    rates: dict[str, float]

    @property
    def prefill_rate(self) -> float | None:
        """Computed prompt tokens/s (cache hits included where the engine does not split them)."""
        return self.rates.get("prompt_computed", self.rates.get("prompt_tokens"))

    @property
    def decode_rate(self) -> float | None:
        return self.rates.get("generation_tokens")


@dataclass(slots=True)
class EndpointView(_Rates):
    """One server's metrics, folded on their own: counters made monotonic
    across its restarts, a baseline taken when it first answered (so a server
    that joins late adds none of its earlier history), rates, errors."""

    name: str
    role: str = "both"
    engine: str | None = None
    values: dict[str, float] = field(default_factory=dict)  # latest; counters monotonic
    missing: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the last scrape's error (cleared on success)
    kv_peak: float | None = None
    baseline: dict[str, float] = field(default_factory=dict)  # each counter when first seen
    rates: dict[str, float] = field(default_factory=dict)  # tokens/s over the last RATE_WINDOW_S
    first_sample_t: float | None = None
    last_sample_t: float | None = None
    _raw: dict[str, float] = field(default_factory=dict)
    _offset: dict[str, float] = field(default_factory=dict)
    _window: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def fold(self, e: ev.MetricsSample) -> None:
        self.engine, self.missing, self.error = e.engine, dict(e.missing), None
        values: dict[str, float] = {}
        for k, v in e.values.items():
            if k in COUNTERS:
                before = self._raw.get(k)
                if before is not None and v < before:  # counter reset (a restart): continue from where it was
                    self._offset[k] = self._offset.get(k, 0.0) + before - v
                self._raw[k] = v
                v += self._offset.get(k, 0.0)
                self.baseline.setdefault(k, v)
            values[k] = v
        self.values = values
        kv = values.get("kv_usage")
        if kv is not None:
            self.kv_peak = kv if self.kv_peak is None else max(self.kv_peak, kv)
        counters = self.since_start()
        # Rates over a window: engines bump prompt counters per request, not per chunk.
        window = self._window
        window.append((e.t, counters))
        while len(window) > 2 and window[1][0] <= e.t - RATE_WINDOW_S:
            window.popleft()
        t0, c0 = window[0]
        if e.t > t0:
            self.rates = {k: (counters[k] - c0[k]) / (e.t - t0) for k in counters if k in c0}
        if self.first_sample_t is None:
            self.first_sample_t = e.t
        self.last_sample_t = e.t

    def since_start(self) -> dict[str, float]:
        """Each counter's growth since this server first answered."""
        v = self.values
        return {k: v[k] - self.baseline[k] for k in COUNTERS if k in v}

    def hit_rate_since_start(self) -> float | None:
        return _hit_rate(self.since_start())

    @property
    def engine_pool(self) -> float | None:
        """One engine instance's KV pool in tokens (never summed over data-parallel ranks)."""
        return self.values.get(ENGINE_POOL) or self.values.get("kv_capacity_tokens")


@dataclass(slots=True)
class ServerView(_Rates):
    """Every endpoint together: counters are the sum of each one's growth
    since it first answered; request gauges and pools add up; KV usage is
    the share of all pools in use (the fullest one's where a pool is unknown)."""

    values: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # fields no endpoint exposes, and why
    engine: str | None = None
    kv_history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    kv_peak: float | None = None
    rates: dict[str, float] = field(default_factory=dict)  # tokens/s, summed over endpoints
    last_sample_t: float | None = None

    def hit_rate_since_start(self) -> float | None:
        return _hit_rate(self.values)  # its counters are growth since each endpoint first answered


def _hit_rate(counters: dict[str, float]) -> float | None:
    if "prefix_queries" not in counters or "prefix_hits" not in counters:
        return None
    dq = counters["prefix_queries"]
    return counters["prefix_hits"] / dq if dq > 0 else None


def merge_endpoints(views: list[EndpointView]) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """(values, rates, missing) of a set of endpoints taken together."""
    values: dict[str, float] = {}
    rates: dict[str, float] = {}
    for ep in views:
        for k, v in ep.values.items():
            if k == "kv_usage" or k == ENGINE_POOL:
                continue
            values[k] = values.get(k, 0.0) + (v - ep.baseline[k] if k in COUNTERS else v)
        for k, r in ep.rates.items():
            rates[k] = rates.get(k, 0.0) + r
    usage = [(ep.values["kv_usage"], ep.values.get("kv_capacity_tokens")) for ep in views if "kv_usage" in ep.values]
    if usage:
        if all(cap for _, cap in usage):
            values["kv_usage"] = sum(u * cap for u, cap in usage) / sum(cap for _, cap in usage)  # type: ignore[misc]
        else:
            values["kv_usage"] = max(u for u, _ in usage)
    missing = dict(views[0].missing) if views else {}
    for ep in views[1:]:
        missing = {k: r for k, r in missing.items() if k in ep.missing}
    return values, rates, missing


class RunState:
    """The live picture of a run, folded from its events one at a time.

    The driver (headless), the UI process (live, from the pipe) and replay
    each keep their own; `version` changes with every event applied, so a
    reader can tell when nothing has changed since it last looked."""

    def __init__(self, header: ev.Header | None = None):
        self.header = header
        self.t = 0.0  # time of the newest event
        self.version = 0  # events applied so far
        self.sessions: dict[str, SessionView] = {}
        self.turns: list[TurnRecord] = []  # every finished attempt, in finishing order
        self.server = ServerView()
        self.endpoints: dict[str, EndpointView] = {}  # by name, in the order they first answered
        self.gpus: list[ev.GpuReading] = []  # every source's GPUs, by node then index
        self.gpu_reason: str | None = None  # why there are none (or why a source has none)
        self._gpu_sources: dict[str, list[ev.GpuReading]] = {}
        self._usage_has_cache: bool | None = None  # any finished turn's usage with cached tokens (None: no turn yet)
        self.log: deque[LogEntry] = deque(maxlen=LOG_LEN)
        self.log_total = 0  # entries ever logged, so a reader can tell which are new
        self.ended: ev.RunEnded | None = None
        self.recording_error: str | None = None
        self._prefilling: dict[str, TurnRecord] = {}
        self._last_prefill_rate: dict[str, float] = {}  # session ('' = any) -> new tokens/s

    # -- folding -------------------------------------------------------------

    def apply(self, e: ev.AnyEvent) -> None:
        self.version += 1
        if e.t > self.t:
            self.t = e.t
        handler = _HANDLERS.get(type(e))
        if handler is not None:
            handler(self, e)

    def _on_planned(self, e: ev.SessionPlanned) -> None:
        self.sessions[e.session] = SessionView(id=e.session, schedule=list(e.schedule), role=e.role, endpoint=e.endpoint)

    def _session(self, sid: str) -> SessionView:
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = SessionView(id=sid, schedule=[])
        return s

    def _on_sent(self, e: ev.RequestSent) -> None:
        s = self._session(e.session)
        rec = TurnRecord(
            session=e.session, turn=e.turn, target=e.target_tokens, new_tokens_est=e.new_tokens_est,
            sent_t=e.t, attempt=e.attempt, prev_prompt_tokens=s.last_prompt_tokens,
            cache_at_sent=self._cache_counters(), kv_peak=self.server.values.get("kv_usage"),
        )
        s.current, s.turn, s.state = rec, e.turn, "prefilling"
        s.recent.clear()
        s.prefill_spans.append([e.t, None])
        self._prefilling[e.session] = rec

    def _on_first(self, e: ev.FirstToken) -> None:
        s = self._session(e.session)
        rec = s.current
        if rec is None or rec.turn != e.turn:
            return
        rec.first_t = e.t
        s.state = "decoding"
        if s.prefill_spans and s.prefill_spans[-1][1] is None:
            s.prefill_spans[-1][1] = e.t
        self._prefilling.pop(e.session, None)

    def _on_times(self, e: ev.TokenTimes) -> None:
        s = self._session(e.session)
        rec = s.current
        if rec is None or rec.turn != e.turn or not e.times:
            return
        times = e.times
        # Foreign prefill spans that overlap this batch; usually none, so the
        # per-token check below runs only while another session prefills.
        lo, hi = (rec.last_t if rec.last_t is not None else times[0]), times[-1]
        spans = [sp for sid, o in self.sessions.items() if sid != e.session for sp in _spans_overlapping(o, lo, hi)]
        prev = rec.last_t
        for t in times:
            if prev is not None:
                dt = t - prev
                if spans and any(a <= t and (b is None or t < b) for a, b in spans):
                    rec.gaps_during.append(dt)
                else:
                    rec.gaps_alone.append(dt)
                if dt > rec.max_gap:
                    rec.max_gap = dt
            prev = t
        rec.last_t = prev
        rec.chunks += len(times)
        recent = s.recent
        recent.extend(times)
        while recent and recent[0] < prev - DECODE_WINDOW_S:
            recent.popleft()
        s.count_arrivals(times)

    def _on_done(self, e: ev.TurnDone) -> None:
        s = self._session(e.session)
        rec = s.current
        if rec is None or rec.turn != e.turn:
            return
        rec.status, rec.done_t = e.status, e.t
        rec.prompt_tokens, rec.cached_tokens = e.prompt_tokens, e.cached_tokens
        rec.completion_tokens, rec.needle, rec.error = e.completion_tokens, e.needle, e.error
        rec.server_prefill_s = e.server_prefill_s
        rec.cache_at_done = self._cache_counters()
        if rec.chunks == 0:
            rec.chunks = e.chunks
        self.turns.append(rec)
        self._prefilling.pop(e.session, None)
        if e.status == "ok":
            self._usage_has_cache = bool(self._usage_has_cache) or e.cached_tokens is not None
            if rec.prompt_tokens is not None:
                s.last_prompt_tokens = rec.prompt_tokens
            s.tokens_per_chunk = rec.tokens_per_chunk
            rate = prefill_tok_s(rec)
            if self.split() is not None and rec.ttft:
                # The decode node reports the transferred KV as cached: the client's estimate is what was new.
                rate = rec.new_tokens_est / rec.ttft
            if rate:
                self._last_prefill_rate[e.session] = self._last_prefill_rate[""] = rate
        if s.prefill_spans and s.prefill_spans[-1][1] is None:
            s.prefill_spans[-1][1] = e.t
        s.current, s.last_done = None, rec
        s.recent.clear()
        if e.status == "ok":
            s.state = "done" if e.turn >= len(s.schedule) else "idle"
            s.needles.append(e.needle)
            self._log(LogEntry(e.t, "info", turn_line(rec), rec.ttft))
        else:
            s.state = "failed" if e.status == "failed" else "cancelled"
            s.failed_turns += e.status == "failed"
            self._log(LogEntry(e.t, "error" if e.status == "failed" else "warn",
                               f"{e.session} turn {e.turn} {e.status}: {e.error or ''}".rstrip(": ")))

    def _endpoint(self, name: str) -> EndpointView:
        ep = self.endpoints.get(name)
        if ep is None:
            listed = next((x for x in (self.header.endpoints if self.header else []) if x.name == name), None)
            ep = self.endpoints[name] = EndpointView(name=name, role=listed.role if listed else "both")
        return ep

    def _on_metrics(self, e: ev.MetricsSample) -> None:
        srv = self.server
        ep = self._endpoint(e.source)
        if e.role is not None:
            ep.role = e.role
        ep.fold(e)
        answered = [x for x in self.endpoints.values() if x.last_sample_t is not None]
        srv.values, srv.rates, srv.missing = merge_endpoints(answered)
        srv.engine = "/".join(sorted({x.engine or "?" for x in answered}))
        kv = srv.values.get("kv_usage")
        if kv is not None:
            srv.kv_history.append((e.t, kv))
            srv.kv_peak = kv if srv.kv_peak is None else max(srv.kv_peak, kv)
            for s in self.sessions.values():
                rec = s.current
                if rec is not None:
                    own = self.endpoints.get(s.endpoint)
                    here = own.values.get("kv_usage", kv) if own is not None else kv  # the session's own server where known
                    rec.kv_peak = here if rec.kv_peak is None else max(rec.kv_peak, here)
        srv.last_sample_t = e.t

    def _on_metrics_error(self, e: ev.MetricsError) -> None:
        ep = self._endpoint(e.source)
        if ep.error != (e.error or None):
            self._log(LogEntry(e.t, "warn", f"metrics {e.source}: {e.error}") if e.error
                      else LogEntry(e.t, "info", f"metrics {e.source}: answering again"))
        ep.error = e.error or None

    def _on_gpu(self, e: ev.GpuSample) -> None:
        self._gpu_sources[e.source] = list(e.gpus)
        self._merge_gpus(None)

    def _on_gpu_missing(self, e: ev.GpuUnavailable) -> None:
        if self.gpu_reason != e.reason:
            self._log(LogEntry(e.t, "warn", f"GPU: {e.reason}"))
        self._gpu_sources[e.source] = []
        self._merge_gpus(e.reason)

    def _merge_gpus(self, reason: str | None) -> None:
        """All sources' GPUs together (one node's source failing leaves the others shown)."""
        gpus = [g for readings in self._gpu_sources.values() for g in readings]
        self.gpus = sorted(gpus, key=lambda g: (g.node, g.index)) if len(self._gpu_sources) > 1 else gpus
        self.gpu_reason = reason if reason is not None or not gpus else None

    def gpu_nodes(self) -> list[tuple[str, list[ev.GpuReading]]]:
        """The GPUs grouped by node, in order."""
        nodes: dict[str, list[ev.GpuReading]] = {}
        for g in self.gpus:
            nodes.setdefault(g.node, []).append(g)
        return list(nodes.items())

    def _on_mark(self, e: ev.Mark) -> None:
        self._log(LogEntry(e.t, "mark", f"mark: {e.note}"))

    def _on_notice(self, e: ev.Notice) -> None:
        if e.topic == "recording":
            self.recording_error = e.message if e.level == "error" else None
        self._log(LogEntry(e.t, e.level, e.message))

    def _on_ended(self, e: ev.RunEnded) -> None:
        self.ended = e
        if e.status == "crashed":
            self._log(LogEntry(e.t, "error", f"run crashed (exit {e.exit_code}): {e.error or 'unknown cause'}"))
        else:
            self._log(LogEntry(e.t, "info", f"run {e.status} (exit {e.exit_code})"))

    def _log(self, entry: LogEntry) -> None:
        self.log.append(entry)
        self.log_total += 1

    def new_log_entries(self, seen: int) -> list[LogEntry]:
        """Entries logged after the first `seen` (those still kept)."""
        n = min(self.log_total - seen, len(self.log))
        return list(self.log)[len(self.log) - n:] if n > 0 else []

    # -- reading -------------------------------------------------------------

    def metrics_errors(self) -> dict[str, str]:
        """Each endpoint whose last scrape failed, and why."""
        return {name: ep.error for name, ep in self.endpoints.items() if ep.error}

    def counters(self) -> dict[str, float]:
        v = self.server.values
        return {k: v[k] for k in COUNTERS if k in v}

    def _cache_counters(self) -> tuple[float, float] | None:
        """The prefix cache's (queries, hits) since start, for a turn's own hit rate."""
        v = self.server.values
        return (v["prefix_queries"], v["prefix_hits"]) if "prefix_queries" in v and "prefix_hits" in v else None

    def prefilling(self) -> list[TurnRecord]:
        return list(self._prefilling.values())

    def aggregate(self) -> SessionsAggregate:
        """Sessions by state, TTFT p50/max of their last turns, decode tok/s p50/min now."""
        by_state: dict[str, int] = {}
        ttfts, rates = [], []
        for s in self.sessions.values():
            by_state[s.state] = by_state.get(s.state, 0) + 1
            if s.last_done is not None and s.last_done.ttft is not None:
                ttfts.append(s.last_done.ttft)
            if s.state == "decoding" and (r := s.decode_rate_now()) is not None:
                rates.append(r)
        return SessionsAggregate(
            total=len(self.sessions), by_state=by_state,
            ttft_p50=statistics.median(ttfts) if ttfts else None, ttft_max=max(ttfts, default=None),
            decode_p50=statistics.median(rates) if rates else None, decode_min=min(rates, default=None))

    def timeline_aggregate(self, first_bucket: int, n: int) -> tuple[list[float], list[float]]:
        """Per bucket, across the sessions that decoded in it: decode tok/s p50 and min."""
        columns: list[list[float]] = [[] for _ in range(n)]
        for s in self.sessions.values():
            for i, v in enumerate(s.timeline_values(first_bucket, n)):
                if v > 0:
                    columns[i].append(v)
        return ([statistics.median(c) if c else 0.0 for c in columns], [min(c) if c else 0.0 for c in columns])

    def prefill_progress(self, now: float) -> list[PrefillProgress]:
        """Each waiting prefill: elapsed time and, from the session's (or else
        the run's) last prefill rate, the expected total wait."""
        out = []
        for rec in self._prefilling.values():
            rate = self._last_prefill_rate.get(rec.session) or self._last_prefill_rate.get("")
            expected = rec.new_tokens_est / rate if rate else None
            out.append(PrefillProgress(session=rec.session, turn=rec.turn, new_tokens=rec.new_tokens_est,
                                       elapsed=max(0.0, now - rec.sent_t), expected=expected))
        return out

    def kv_fits_sequences(self) -> int | None:
        """How many sequences as long as the longest session fit in one engine's
        KV pool: per endpoint (its own sessions' longest, or the run's where
        none is sent there), the tightest one."""
        longest_all = max((s.context_tokens or 0 for s in self.sessions.values()), default=0)
        fits = []
        for ep in self.endpoints.values():
            pool = ep.engine_pool
            mine = [s.context_tokens or 0 for s in self.sessions.values() if s.endpoint == ep.name]
            longest = max(mine, default=0) or longest_all
            if pool and longest:
                fits.append(int(pool // longest))
        return min(fits, default=None)

    def split(self) -> tuple[list[EndpointView], list[EndpointView]] | None:
        """(prefill, decode) endpoints of a prefill/decode split that have answered; None if not split."""
        pre = [x for x in self.endpoints.values() if x.role == "prefill" and x.last_sample_t is not None]
        dec = [x for x in self.endpoints.values() if x.role == "decode" and x.last_sample_t is not None]
        return (pre, dec) if pre and dec else None

    def turn_place(self, s: SessionView) -> tuple[str, str] | None:
        """Where a split deployment has this session's turn, as far as the
        metrics tell: (phase, node), phase one of prefill, transfer (the decode
        node holds it, waiting for its KV), decode, queued. None when the
        deployment is not split or the session is not in a turn."""
        split = self.split()
        if split is None or s.state not in ("prefilling", "decoding"):
            return None
        pre, dec = split
        if s.state == "decoding":
            return ("decode", dec[0].name if len(dec) == 1 else "")
        if busy := [x.name for x in pre if x.values.get("running", 0) > 0]:
            return ("prefill", busy[0])
        if held := [x.name for x in dec if x.values.get("waiting", 0) + x.values.get("running", 0) > 0]:
            return ("transfer", held[0])
        return ("queued", "")

    def foreign_prefill_cells(self, session: str, start: float, step: float, n: int, now: float) -> list[bool]:
        """For n time cells of `step` seconds from `start`: whether another
        session had a prefill in flight during each one (for the chart's shading)."""
        cells = [False] * n
        end = start + n * step
        for sid, o in self.sessions.items():
            if sid == session:
                continue
            for a, b in o.prefill_spans:
                b = now if b is None else b
                if b <= start or a >= end:
                    continue
                first = max(0, int((a - start) // step))
                last = min(n - 1, math.ceil((b - start) / step) - 1)  # a span ending on a cell edge stops before it
                for i in range(first, last + 1):
                    cells[i] = True
        return cells

    def last_turn_hit_rate(self) -> float | None:
        finished = [r for r in self.turns if r.status == "ok"]
        return hit_rate(finished[-1]) if finished else None

    def usage_reports_cache(self) -> bool | None:
        """Whether the server puts cached tokens in usage (None: no turn finished yet)."""
        return self._usage_has_cache

    def preemptions_this_run(self) -> float | None:
        return self.server.values.get("preemptions")  # counters are growth since each server first answered

    def hit_rate_since_start(self) -> float | None:
        return self.server.hit_rate_since_start()


COLLAPSE_AT = 3  # finished turns in one second that the log shows as one line


def collapsed_log(entries: list[LogEntry]) -> list[LogEntry]:
    """The log with runs of COLLAPSE_AT or more turns that finished within the
    same second folded into one line: "12 turns done: TTFT 0.31-0.42s"."""
    out: list[LogEntry] = []
    group: list[LogEntry] = []

    def close() -> None:
        if len(group) >= COLLAPSE_AT:
            ttfts = [g.ttft for g in group if g.ttft is not None]
            span = f"TTFT {min(ttfts):.2f}-{max(ttfts):.2f}s" if ttfts else "no TTFT"
            out.append(LogEntry(group[-1].t, "info", f"{len(group)} turns done: {span}"))
        else:
            out.extend(group)
        group.clear()

    for e in entries:
        if e.ttft is not None and group and int(e.t) == int(group[0].t):
            group.append(e)
            continue
        close()
        if e.ttft is not None:
            group.append(e)
        else:
            out.append(e)
    close()
    return out


def _spans_overlapping(s: SessionView, lo: float, hi: float) -> list[tuple[float, float | None]]:
    """s's prefill spans that overlap [lo, hi], newest first; spans are in time
    order, so the scan stops at the first one that ended before `lo`."""
    out = []
    for a, b in reversed(s.prefill_spans):
        if b is not None and b <= lo:
            break
        if a <= hi:
            out.append((a, b))
    return out


_HANDLERS = {
    ev.SessionPlanned: RunState._on_planned,
    ev.RequestSent: RunState._on_sent,
    ev.FirstToken: RunState._on_first,
    ev.TokenTimes: RunState._on_times,
    ev.TurnDone: RunState._on_done,
    ev.MetricsSample: RunState._on_metrics,
    ev.MetricsError: RunState._on_metrics_error,
    ev.GpuSample: RunState._on_gpu,
    ev.GpuUnavailable: RunState._on_gpu_missing,
    ev.Mark: RunState._on_mark,
    ev.Notice: RunState._on_notice,
    ev.RunEnded: RunState._on_ended,
}
