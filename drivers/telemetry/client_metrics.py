"""rampwatch's own client-side figures, exposed for Prometheus with prometheus-client (`--serve-metrics
[HOST:]PORT`), so the dashboards people already watch can show what the client saw beside the engine's own.

The exporter reads the run's fold (RunState), the same one the UI and the report read, and adds nothing of its
own: after each event it takes what changed (a first token, new gaps, turns settled: turns.py's figures, their
--warmup mark and --slo verdict) into the series. A sped-up demo's times are the fold's modelled ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.gaps import is_delivery_gap
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.model.turns import TurnRecord, hit_rate, reused_tokens

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560)
GAP_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
# Every series the exporter serves (the Grafana dashboard test checks its queries against these).
SERIES = (
    "rampwatch_ttft_seconds",
    "rampwatch_inter_token_gap_seconds",
    "rampwatch_decode_tokens_per_second",
    "rampwatch_prefill_in_flight_seconds",
    "rampwatch_turn",
    "rampwatch_context_tokens",
    "rampwatch_hit_rate",
    "rampwatch_turns",
    "rampwatch_failed_turns",
    "rampwatch_needle_found",
    "rampwatch_needle_asked",
    "rampwatch_late_turns",
    "rampwatch_slo_met_turns",
    "rampwatch_slo_met_conversations",
    "rampwatch_cached_tokens",
    "rampwatch_ideal_cached_tokens",
)


class ClientMetrics:
    """Per-session series, labelled session and run (the run's salt), read off the fold `state_of()` returns
    (a callable: the UI process replaces its fold when the driver's header arrives)."""

    def __init__(self, state_of: Callable[[], RunState | None], clock: Callable[[], float], run: str = ""):
        """`clock`: the run's recorded (wall) time now, for the prefills in flight at a scrape."""
        self.state_of, self.clock, self.run = state_of, clock, run
        self.registry = r = CollectorRegistry()
        lab = ("session", "run")

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lab, registry=r)

        def counter(name: str, doc: str, *more: str) -> Counter:
            return Counter(name, doc, (*lab, *more), registry=r)

        self.ttft = Histogram(
            "rampwatch_ttft_seconds", "Client time to first token per turn.", lab, buckets=TTFT_BUCKETS, registry=r
        )
        self.gap = Histogram(
            "rampwatch_inter_token_gap_seconds",
            "Time between deliveries of streamed text, as the client read them.",
            lab,
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.decode = gauge(
            "rampwatch_decode_tokens_per_second", "Decode tokens/s of the session's last finished turn."
        )
        self.turn = gauge("rampwatch_turn", "The session's current turn (1-based).")
        self.context = gauge("rampwatch_context_tokens", "Prompt tokens of the session's last finished turn.")
        self.hit = gauge("rampwatch_hit_rate", "Prefix-cache hit rate of the session's last finished turn.")
        self.turns = counter("rampwatch_turns", "Finished turns, by status (ok, failed, cancelled).", "status")
        self.failed = counter("rampwatch_failed_turns", "Turns that failed.")
        self.found = counter("rampwatch_needle_found", "Turns whose reply found the needle.")
        self.asked = counter("rampwatch_needle_asked", "Turns that asked for the needle (finished ok).")
        self.late = counter("rampwatch_late_turns", "Turns past --warmup sent more than 10 ms after they were due.")
        self.slo_met = counter("rampwatch_slo_met_turns", "Turns past --warmup that met every bound of --slo.")
        self.cached = counter("rampwatch_cached_tokens", "--trace: prompt tokens the prefix cache supplied.")
        self.ideal_cached = counter("rampwatch_ideal_cached_tokens", "--trace: prompt tokens the trace allowed it.")
        # A gauge, not a counter: a conversation counts while every turn it finished met the SLO, and a later miss
        # takes it back out (ConversationsMet, the report's definition); sum() over sessions is the report's count.
        self.slo_met_conversations = gauge(
            "rampwatch_slo_met_conversations",
            "1 while every finished turn of the conversation (begun past --warmup) met every bound of --slo, else 0.",
        )
        self._fold: RunState | None = None
        self._settled = 0  # turns of the fold's `settled` already in the series
        self._first_seen: dict[str, TurnRecord] = {}  # each session's turn whose TTFT is observed
        self._gaps_seen: dict[str, tuple[TurnRecord, int, int]] = {}  # each session's turn and its gaps observed
        r.register(_PrefillInFlight(self))
        self._server: WSGIServer | None = None

    def __call__(self, e: ev.AnyEvent) -> None:
        """A listener: called after the fold applied `e`; takes what changed into the series."""
        state = self.state_of()
        if state is None:
            return
        if state is not self._fold:  # a new fold (the UI's, once the driver's header came): start over on it
            self._fold, self._settled = state, 0
            self._first_seen.clear()
            self._gaps_seen.clear()
        if isinstance(e, ev.RequestSent | ev.FirstToken | ev.TokenTimes):
            view = state.sessions.get(e.session)
            rec = view.current if view is not None else None
            if rec is not None:
                self._in_flight(e.session, rec)
        while self._settled < len(state.settled):
            self._settle(state, state.settled[self._settled])
            self._settled += 1

    def _in_flight(self, session: str, rec: TurnRecord) -> None:
        labels = (session, self.run)
        self.turn.labels(*labels).set(rec.turn)
        if rec.ttft is not None and self._first_seen.get(session) is not rec:
            self._first_seen[session] = rec
            self.ttft.labels(*labels).observe(rec.ttft)
        self._observe_gaps(session, rec)

    def _observe_gaps(self, session: str, rec: TurnRecord) -> None:
        """The turn's delivery gaps not yet observed (the fold appends to its two arrays)."""
        seen_rec, alone, during = self._gaps_seen.get(session, (rec, 0, 0))
        if seen_rec is not rec:
            alone = during = 0
        if len(rec.gaps_alone) == alone and len(rec.gaps_during) == during:
            return
        gap = self.gap.labels(session, self.run)
        for g in (*rec.gaps_alone[alone:], *rec.gaps_during[during:]):
            if is_delivery_gap(g):
                gap.observe(g)
        self._gaps_seen[session] = (rec, len(rec.gaps_alone), len(rec.gaps_during))

    def _settle(self, state: RunState, rec: TurnRecord) -> None:
        """A turn whose figures are final: its outcome, needle, size, rate, hit, lateness and verdict."""
        labels = (rec.session, self.run)
        self.turns.labels(*labels, rec.status).inc()
        if rec.status == "failed":
            self.failed.labels(*labels).inc()
        if not rec.in_warmup:
            if rec.late:
                self.late.labels(*labels).inc()
            if rec.slo_met:
                self.slo_met.labels(*labels).inc()
        if rec.slo_met is not None:
            met = rec.session in state.goodput.conversations
            self.slo_met_conversations.labels(*labels).set(1 if met else 0)
        if rec.status != "ok":
            self._forget(self.hit, labels)  # as the Sessions panel's hit: none for a turn that did not finish ok
            return
        self.asked.labels(*labels).inc()
        if rec.needle:
            self.found.labels(*labels).inc()
        if rec.prompt_tokens is not None:
            self.context.labels(*labels).set(rec.prompt_tokens)
        if (rate := rec.decode_rate) is not None:
            self.decode.labels(*labels).set(rate)
        if (hit := hit_rate(rec)) is not None:
            self.hit.labels(*labels).set(hit)
        else:
            self._forget(self.hit, labels)
        reused = reused_tokens(rec)
        if rec.ideal_cached is not None and reused is not None:  # --trace: efficiency = rate(cached) / rate(ideal)
            self.cached.labels(*labels).inc(reused)
            self.ideal_cached.labels(*labels).inc(rec.ideal_cached)

    @staticmethod
    def _forget(gauge: Gauge, labels: tuple[str, str]) -> None:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass  # never set

    def prefills(self) -> Iterator[tuple[str, float]]:
        """(session, seconds) of each prefill still waiting for its first token, now."""
        state = self._fold
        if state is None:
            return
        now = state.modelled_time(self.clock())
        for rec in state.prefilling():
            elapsed = rec.prefill_elapsed(now)
            if elapsed is not None:
                yield rec.session, elapsed

    # -- serving -------------------------------------------------------------------

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics in a thread of its own; OSError when the address is taken."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)

    @property
    def port(self) -> int | None:
        return self._server.server_port if self._server else None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _PrefillInFlight:
    """rampwatch_prefill_in_flight_seconds, computed when Prometheus scrapes: it grows while a prefill waits."""

    def __init__(self, exporter: ClientMetrics):
        self.exporter = exporter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "rampwatch_prefill_in_flight_seconds",
            "Seconds the session's current prefill has waited for its first token (absent: none).",
            labels=["session", "run"],
        )
        for sid, seconds in self.exporter.prefills():
            g.add_metric([sid, self.exporter.run], seconds)
        yield g


def parse_listen(text: str) -> tuple[str, int]:
    """'[HOST:]PORT' -> (host, port); loopback unless a host is given. ValueError when it is not one."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not [HOST:]PORT: {text!r} (e.g. 9464 or 0.0.0.0:9464)")
    return host, int(port)
