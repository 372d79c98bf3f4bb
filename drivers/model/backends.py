"""Which backend served each turn, and where that came from: one home for it, the turn's record (`served_by`,
`served_by_source`), which the report's row, compare, the focus screen and the Sessions panel all read.

Sources, the first that speaks wins:
- `span`: the engine's own OTLP span (--otlp) names its instance in its resource (service.instance.id, else
  service.name, else host.name; drivers/telemetry/otlp.py). It wins over the counters whenever it comes.
- (a router response header naming the worker: vllm-router sends none, so there is no such source yet.)
- `counters`: with two or more backends scraped on their own (--metrics-url per replica, role both), the one whose
  prompt-token and request counters moved between the sample before the turn was sent and the first sample after
  it ended. Its own request surely moved one of them; when only one moved, by at least this turn's prompt, that one
  served it. When several moved, the one that moved by exactly this turn's prompt (and one request) is named only
  if no other turn of the run overlapped the window; otherwise the turn is `ambiguous`, never a guess; so is a
  turn whose window a backend's failing scrape left open (its counters cannot say). A turn the client sent
  straight to one of those servers (replicas it spreads the sessions over itself, matched by host:port) needs no
  telling: it is not attributed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.endpoints import EndpointView
from rampwatch.drivers.model.events import endpoint_name
from rampwatch.drivers.model.turns import TurnRecord

SPAN, COUNTERS, AMBIGUOUS = "span", "counters", "ambiguous"  # the values of TurnRecord.served_by_source
RECENT_TURNS = 4096  # finished turns' windows kept for the overlap check (a trace's thousands are not all kept)


def backends(endpoints: Iterable[EndpointView]) -> list[EndpointView]:
    """The endpoints a turn could have been served by, told apart by their counters: the answering model servers
    (role both; not a router, not a split's halves) that count prompt tokens. Fewer than two: nothing to tell."""
    found = [ep for ep in endpoints if ep.role == "both" and ep.last_sample_t is not None and ep.error is None]
    found = [ep for ep in found if "prompt_tokens" in ep.values]
    return found if len(found) >= 2 else []


def _counts(ep: EndpointView) -> tuple[float, float | None, float]:
    """(prompt tokens, requests or None where not counted, sample time) since the endpoint first answered."""
    grown = ep.since_start()
    return grown.get("prompt_tokens", 0.0), grown.get("requests"), ep.last_sample_t or 0.0


class BackendLedger:
    """The turns waiting for their backends' counters to cover them, and the windows of turns that may overlap."""

    def __init__(self) -> None:
        self.awaiting: list[TurnRecord] = []
        self._open: dict[int, TurnRecord] = {}  # turns in flight, by id(record)
        self._recent: deque[tuple[float, float, int]] = deque(maxlen=RECENT_TURNS)  # (sent, done, id(record))

    def sent(
        self, rec: TurnRecord, endpoints: Iterable[EndpointView], target: str = "", listed: Iterable[ev.Endpoint] = ()
    ) -> None:
        """Snapshot every backend's counters as the turn goes (none: fewer than two backends, or `target`, the
        endpoint the turn was sent to, is one of them: by name, or the host:port of its `listed` metrics URL)."""
        found = backends(endpoints)
        scraped_at = {x.name: endpoint_name(x.metrics) for x in listed if x.metrics}
        if found and all(target not in (ep.name, scraped_at.get(ep.name)) for ep in found):
            rec.counters_at_sent = {ep.name: _counts(ep) for ep in found}
            self._open[id(rec)] = rec

    def done(self, rec: TurnRecord) -> None:
        if self._open.pop(id(rec), None) is None:
            return
        self._recent.append((rec.sent_t, rec.done_t if rec.done_t is not None else rec.sent_t, id(rec)))
        if rec.status == "ok" and rec.served_by_source != SPAN:
            self.awaiting.append(rec)
        else:
            rec.counters_at_sent = None

    def span(self, rec: TurnRecord, e: ev.EngineSpan) -> bool:
        """The span names the turn's backend: it wins. True when that changed the record."""
        if not e.backend or (rec.served_by, rec.served_by_source) == (e.backend, SPAN):
            return False
        rec.served_by, rec.served_by_source = e.backend, SPAN
        return True

    def sampled(self, endpoints: Iterable[EndpointView], final: bool = False) -> list[TurnRecord]:
        """The waiting turns every backend has now been sampled after (all of them at the run's end), attributed."""
        by_name = {ep.name: ep for ep in endpoints}
        ready, waiting = [], []
        for rec in self.awaiting:
            (ready if final or self._covered(rec, by_name) else waiting).append(rec)
        self.awaiting = waiting
        changed = []
        for rec in ready:
            if rec.served_by_source != SPAN and self._attribute(rec, by_name):
                changed.append(rec)
            rec.counters_at_sent = None
        return changed

    @staticmethod
    def _covered(rec: TurnRecord, by_name: dict[str, EndpointView]) -> bool:
        """Every backend sampled after the turn ended, or failing to answer (a sample that may never come: the
        turn is then told as far as the others can)."""
        done = rec.done_t if rec.done_t is not None else rec.sent_t
        names = rec.counters_at_sent or {}
        return all(
            (ep := by_name.get(n)) is not None and (ep.sampled_after(done) or ep.error is not None) for n in names
        )

    def _attribute(self, rec: TurnRecord, by_name: dict[str, EndpointView]) -> bool:
        before = rec.counters_at_sent or {}
        moved: dict[str, tuple[float, float | None]] = {}
        t0, t1 = min((c[2] for c in before.values()), default=rec.sent_t), rec.sent_t
        for name, (prompt0, requests0, _) in before.items():
            ep = by_name.get(name)
            if ep is None or ep.last_sample_t is None or ep.error is not None:  # its counters cannot say
                rec.served_by, rec.served_by_source = None, AMBIGUOUS
                return True
            prompt1, requests1, t = _counts(ep)
            t1 = max(t1, t)
            dr = None if requests0 is None or requests1 is None else requests1 - requests0
            if prompt1 - prompt0 > 0 or (dr or 0) > 0:
                moved[name] = (prompt1 - prompt0, dr)
        if not moved:
            return False  # the counters never showed it: no source
        if len(moved) == 1:
            ((name, (dp, dr)),) = moved.items()
            # Another turn's request may have moved it while this one's is not counted yet: not this turn's then.
            if dp >= (rec.prompt_tokens or 0) and (dr is None or dr >= 1):
                rec.served_by, rec.served_by_source = name, COUNTERS
            else:
                rec.served_by, rec.served_by_source = None, AMBIGUOUS
            return True
        exact = [n for n, (dp, dr) in moved.items() if dp == rec.prompt_tokens and dr in (None, 1)]
        if len(exact) == 1 and not self._overlapped(rec, t0, t1):
            rec.served_by, rec.served_by_source = exact[0], COUNTERS
        else:
            rec.served_by, rec.served_by_source = None, AMBIGUOUS
        return True

    def _overlapped(self, rec: TurnRecord, t0: float, t1: float) -> bool:
        """Whether another turn of the run was in flight at some moment of the window [t0, t1]."""
        if any(other is not rec and other.sent_t < t1 for other in self._open.values()):
            return True
        return any(key != id(rec) and sent < t1 and done > t0 for sent, done, key in self._recent)
