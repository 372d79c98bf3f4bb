"""rampwatch's own client-side figures, exposed for Prometheus with
prometheus-client (`--serve-metrics [HOST:]PORT`), so the dashboards people
already watch can show what the client saw beside the engine's own metrics.

The exporter is a listener on the event stream: it keeps only what the
series need (per session: the turn in flight, its send and last token times),
never the events themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.modelled import modelled
from rampwatch.drivers.model.slo import ConversationsMet, Slo, Warmup, meets
from rampwatch.drivers.model.turns import LATE_S, TurnRecord, decode_tok_s, is_delivery_gap

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
    "rampwatch_turns",
    "rampwatch_failed_turns",
    "rampwatch_needle_found",
    "rampwatch_needle_asked",
    "rampwatch_late_turns",
    "rampwatch_slo_met_turns",
    "rampwatch_slo_met_conversations",
)


@dataclass
class _InFlight:
    turn: int
    sent_t: float
    first_t: float | None = None
    last_t: float | None = None
    due_t: float | None = None  # open loop: when the turn was due
    new_tokens_est: int = 0
    answer_t: float | None = None
    max_gap: float = 0.0


class RunExporter:
    """Per-session series, labelled session and run (the run's salt)."""

    def __init__(
        self,
        clock: Callable[[], float],
        run: str = "",
        slo: Slo | None = None,
        time_scale: float = 1.0,
        warmup: Warmup | None = None,
    ):
        """`time_scale`: a sped-up demo's; its figures are served in modelled seconds, as the UI shows them.
        `warmup`: the run's --warmup, whose conversations the SLO's conversation count leaves out."""
        self.clock, self.run, self.slo, self.time_scale, self.warmup = clock, run, slo, time_scale, warmup
        self.registry = r = CollectorRegistry()
        lab = ("session", "run")
        self.ttft = Histogram(
            "rampwatch_ttft_seconds", "Client time to first token per turn.", lab, buckets=TTFT_BUCKETS, registry=r
        )
        self.gap = Histogram(
            "rampwatch_inter_token_gap_seconds",
            "Time between streamed text chunks, as the client read them.",
            lab,
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.decode = Gauge(
            "rampwatch_decode_tokens_per_second",
            "Decode tokens/s of the session's last finished turn.",
            lab,
            registry=r,
        )
        self.turn = Gauge("rampwatch_turn", "The session's current turn (1-based).", lab, registry=r)
        self.context = Gauge(
            "rampwatch_context_tokens", "Prompt tokens of the session's last finished turn.", lab, registry=r
        )
        self.turns = Counter(
            "rampwatch_turns", "Finished turns, by status (ok, failed, cancelled).", (*lab, "status"), registry=r
        )
        self.failed = Counter("rampwatch_failed_turns", "Turns that failed.", lab, registry=r)
        self.found = Counter("rampwatch_needle_found", "Turns whose reply found the needle.", lab, registry=r)
        self.asked = Counter(
            "rampwatch_needle_asked", "Turns that asked for the needle (finished ok).", lab, registry=r
        )
        self.late = Counter(
            "rampwatch_late_turns", "Open loop: turns sent more than 10 ms after they were due.", lab, registry=r
        )
        self.slo_met = Counter(
            "rampwatch_slo_met_turns", "Turns that met every bound of --slo (goodput: its rate).", lab, registry=r
        )
        # A gauge, not a counter: a conversation counts while every turn it finished met the SLO, and a later miss
        # takes it back out (ConversationsMet, the report's definition); sum() over sessions is the report's count.
        self.slo_met_conversations = Gauge(
            "rampwatch_slo_met_conversations",
            "1 while every finished turn of the conversation (begun past --warmup) met every bound of --slo, else 0.",
            lab,
            registry=r,
        )
        self._flight: dict[str, _InFlight] = {}
        self._ramp: set[str] = set()  # the ramp conversations (the ones the SLO's conversation count is of)
        self._conversations = ConversationsMet()
        r.register(_PrefillInFlight(self))
        self._server: WSGIServer | None = None

    def __call__(self, e: ev.AnyEvent) -> None:
        """A hub listener: fold one event into the series."""
        if self.time_scale != 1.0:
            e = modelled(e, self.time_scale)
        if isinstance(e, ev.SessionPlanned) and e.role == "ramp":
            self._ramp.add(e.session)
        elif isinstance(e, ev.RequestSent):
            self._flight[e.session] = _InFlight(turn=e.turn, sent_t=e.t, due_t=e.due, new_tokens_est=e.new_tokens_est)
            self.turn.labels(e.session, self.run).set(e.turn)
            if e.due is not None and e.t - e.due > LATE_S:
                self.late.labels(e.session, self.run).inc()
        elif isinstance(e, ev.FirstToken):
            f = self._flight.get(e.session)
            if f is not None and f.turn == e.turn and f.first_t is None:
                f.first_t = e.t
                if not e.reasoning:
                    f.answer_t = e.t
                self.ttft.labels(e.session, self.run).observe(e.t - f.sent_t)
        elif isinstance(e, ev.FirstAnswer):
            f = self._flight.get(e.session)
            if f is not None and f.turn == e.turn:
                f.answer_t = e.t
        elif isinstance(e, ev.TokenTimes):
            f = self._flight.get(e.session)
            if f is None or f.turn != e.turn:
                return
            gap = self.gap.labels(e.session, self.run)
            for t in e.times:
                if f.last_t is not None and is_delivery_gap(t - f.last_t):  # the report's rule: one read, one delivery
                    gap.observe(t - f.last_t)
                    f.max_gap = max(f.max_gap, t - f.last_t)
                f.last_t = t
        elif isinstance(e, ev.TurnDone):
            self._done(e)

    def _done(self, e: ev.TurnDone) -> None:
        f = self._flight.pop(e.session, None)
        labels = (e.session, self.run)
        self.turns.labels(*labels, e.status).inc()
        if e.status == "failed":
            self.failed.labels(*labels).inc()
        if self.slo is not None:
            self._judge(e, f if f is not None else _InFlight(turn=e.turn, sent_t=e.t))
        if e.status != "ok":
            return
        self.asked.labels(*labels).inc()
        if e.needle:
            self.found.labels(*labels).inc()
        if e.prompt_tokens is not None:
            self.context.labels(*labels).set(e.prompt_tokens)
        if f is not None:
            rate = decode_tok_s(e.completion_tokens or e.chunks, f.first_t, f.last_t)
            if rate is not None:
                self.decode.labels(*labels).set(rate)

    def _judge(self, e: ev.TurnDone, f: _InFlight) -> None:
        """Count a turn that met the SLO, and set whether its conversation (a ramp one) counts as met now."""
        assert self.slo is not None
        labels = (e.session, self.run)
        rec = _record(e, f)
        ok = meets(self.slo, rec)
        if ok:
            self.slo_met.labels(*labels).inc()
        if e.session in self._ramp:
            counts = self._conversations.add(e.session, ok, self.warmup is not None and self.warmup.excludes(rec))
            self.slo_met_conversations.labels(*labels).set(1 if counts else 0)

    def prefills(self) -> Iterator[tuple[str, float]]:
        """(session, seconds) of each prefill still waiting for its first token."""
        now = self.clock() * self.time_scale
        for sid, f in list(self._flight.items()):
            if f.first_t is None:
                yield sid, max(0.0, now - f.sent_t)

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


def _record(e: ev.TurnDone, f: _InFlight) -> TurnRecord:
    """The turn as the SLO judges it (drivers/model/slo.py), from what the exporter kept of it."""
    return TurnRecord(
        session=e.session,
        turn=e.turn,
        target=0,
        new_tokens_est=f.new_tokens_est,
        sent_t=f.sent_t,
        due_t=f.due_t,
        first_t=f.first_t,
        answer_t=f.answer_t,
        last_t=f.last_t,
        max_gap=f.max_gap,
        status=e.status,
        prompt_tokens=e.prompt_tokens,
        cached_tokens=e.cached_tokens,
        completion_tokens=e.completion_tokens,
        chunks=e.chunks,
    )


class _PrefillInFlight:
    """rampwatch_prefill_in_flight_seconds, computed when Prometheus scrapes: it grows while a prefill waits."""

    def __init__(self, exporter: RunExporter):
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
