"""Which backend served each turn (issue 37), on the fold alone: from the span's resource, from the backends'
counters (one that moved, or the exact one when no other turn overlapped), `ambiguous` otherwise; each session's
affinity and moves; the Sessions panel's mark."""

from __future__ import annotations

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.affinity import moves_of
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.routing import affinity_lines, router_lines
from rampwatch.drivers.telemetry.otlp import backend_of

HEADER = ev.Header(
    rampwatch_version="t",
    command=[],
    mode="run",
    server="http://router",
    endpoints=[
        ev.Endpoint(name="router", role="router", metrics="http://router/metrics"),
        ev.Endpoint(name="r0", metrics="http://10.0.0.1:8000/metrics"),
        ev.Endpoint(name="r1", metrics="http://10.0.0.2:8000/metrics"),
    ],
)


def sample(t: float, name: str, prompt: float, requests: float, asked_t: float | None = None) -> ev.MetricsSample:
    values = {"prompt_tokens": prompt, "requests": requests}
    return ev.MetricsSample(t=t, source=name, engine="vllm", values=values, asked_t=asked_t)


def turn(sid: str, n: int, sent: float, done: float, prompt: int, cached: int = 0) -> list[ev.AnyEvent]:
    rid = f"run-{sid}-t{n}"
    return [
        ev.RequestSent(
            t=sent, session=sid, turn=n, target_tokens=prompt, new_tokens_est=prompt, body_bytes=1, request_id=rid
        ),
        ev.FirstToken(t=sent + 0.1, session=sid, turn=n),
        ev.TurnDone(t=done, session=sid, turn=n, status="ok", prompt_tokens=prompt, cached_tokens=cached),
    ]


def fold(events: list[ev.AnyEvent]) -> RunState:
    state = RunState(HEADER)
    for e in [ev.SessionPlanned(t=0.0, session=s, schedule=[1, 2, 3], salt="x") for s in ("s1", "s2")] + events:
        state.apply(e)
    state.apply(ev.RunEnded(t=99.0, status="done", exit_code=0))
    return state


def served(state: RunState) -> list[tuple[str, int, str | None, str | None]]:
    return [(r.session, r.turn, r.served_by, r.served_by_source) for r in state.turns]


def test_the_span_resource_names_the_instance_first_then_the_service_then_the_host():
    assert backend_of({"service.instance.id": "r0", "service.name": "vllm", "host.name": "h"}) == "r0"
    assert backend_of({"service.name": "replica-1", "host.name": "h"}) == "replica-1"
    assert backend_of({"service.name": "unknown_service:python", "host.name": "gpu-3"}) == "gpu-3"
    assert backend_of({}) == ""


def test_counters_name_the_one_backend_that_moved_between_the_samples_around_a_turn():
    """Turns apart from each other: each is the only request in its window, so the backend that moved served it;
    the session moved at turn 2, and the move carries the hit rates of turns 1 and 2."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + [sample(2.0, "r0", 1000, 1), sample(2.0, "r1", 0, 0)]
    events += turn("s1", 2, 3.0, 3.5, 2000, cached=1000) + [sample(4.0, "r0", 1000, 1), sample(4.0, "r1", 2000, 1)]
    events += turn("s1", 3, 5.0, 5.5, 3000, cached=0) + [sample(6.0, "r0", 1000, 1), sample(6.0, "r1", 5000, 2)]
    state = fold(events)
    assert served(state) == [("s1", 1, "r0", "counters"), ("s1", 2, "r1", "counters"), ("s1", 3, "r1", "counters")]
    rep = build_report(state)
    a = rep.sessions[0].affinity
    assert a is not None and a.first_backend == "r0" and a.held_turns == 1 and a.served_turns == 3
    assert [(m.turn, m.from_backend, m.to_backend, m.hit_before, m.hit_after) for m in a.moves] == [
        (2, "r0", "r1", 0.0, 0.5)
    ]
    assert state.sessions["s1"].moves == 1
    assert affinity_lines(rep)[1] == "s1 moved once: turn 2 r0→r1, hit 0%→50%"


def test_overlapping_turns_on_two_backends_are_ambiguous_not_guessed():
    """Two sessions' turns in one window, one on each backend: both backends moved, and another turn of the run was
    in flight, so neither turn is named, even where one backend moved by exactly its prompt."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + turn("s2", 1, 1.0, 1.6, 1200)
    events += [sample(2.0, "r0", 1000, 1), sample(2.0, "r1", 1200, 1)]
    state = fold(events)
    assert served(state) == [("s1", 1, None, "ambiguous"), ("s2", 1, None, "ambiguous")]
    rep = build_report(state)
    assert rep.affinity is not None and rep.affinity.ambiguous_turns == 2 and rep.affinity.share is None
    assert rep.sessions[0].turns[0].served_by_source == "ambiguous"


def test_overlapping_turns_on_one_backend_are_still_named():
    """Both turns overlapped but only r1 moved: whichever turn is which, r1 served them both."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + turn("s2", 1, 1.0, 1.6, 1200)
    events += [sample(2.0, "r0", 0, 0), sample(2.0, "r1", 2200, 2)]
    assert served(fold(events)) == [("s1", 1, "r1", "counters"), ("s2", 1, "r1", "counters")]


def test_a_turn_waits_for_every_backend_to_be_sampled_after_it_ended():
    """r1's sample after the turn has not come when r0's does: nothing is said until it does."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + [sample(2.0, "r0", 0, 0)]
    state = RunState(HEADER)
    for e in events:
        state.apply(e)
    assert served(state) == [("s1", 1, None, None)] and state.backends.awaiting
    state.apply(sample(2.1, "r1", 1000, 1))
    assert served(state) == [("s1", 1, "r1", "counters")] and not state.backends.awaiting


def test_a_scrape_sent_before_the_turn_ended_does_not_cover_it_though_answered_after():
    """A scrape's values are the server's at some moment between its sending and its answer: one sent as the turn
    ran (its prompt counted, its request not yet) and answered after it ended is no sample after it. Taken as one
    (its answer's time), the lone mover's request count had not moved, and the turn read `ambiguous` (CI saw it
    once against real vLLM replicas); it waits for the next scrape instead."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000)
    events += [sample(1.52, "r0", 1000, 0, asked_t=1.45), sample(1.52, "r1", 0, 0, asked_t=1.45)]
    state = RunState(HEADER)
    for e in events:
        state.apply(e)
    assert served(state) == [("s1", 1, None, None)] and state.backends.awaiting
    state.apply(sample(1.62, "r0", 1000, 1, asked_t=1.55))
    state.apply(sample(1.62, "r1", 0, 0, asked_t=1.55))
    assert served(state) == [("s1", 1, "r0", "counters")] and not state.backends.awaiting


def test_a_span_naming_its_backend_wins_over_the_counters_whenever_it_comes():
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + [sample(2.0, "r0", 1000, 1), sample(2.0, "r1", 0, 0)]
    events += [ev.EngineSpan(t=3.0, request_id="run-s1-t1", backend="replica-b")]
    assert served(fold(events)) == [("s1", 1, "replica-b", "span")]


@pytest.mark.parametrize("endpoint", ["r1", "10.0.0.2:8000"], ids=["by-name", "by-url"])
def test_turns_sent_straight_to_a_replica_are_not_attributed(endpoint):
    """Replicas the client spreads the sessions over itself: where a turn went is no question for the counters,
    whether the session's endpoint is the scraped one's name or its URL's host:port (`run http://10.0.0.2:8000
    ... --metrics-url r1=http://10.0.0.2:8000/metrics` names the session's endpoint by host:port)."""
    planned = ev.SessionPlanned(t=0.0, session="s1", schedule=[1], salt="x", endpoint=endpoint)
    events = [planned, sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + [sample(2.0, "r0", 0, 0), sample(2.0, "r1", 1000, 1)]
    state = RunState(HEADER)
    for e in events:
        state.apply(e)
    assert served(state) == [("s1", 1, None, None)] and not state.backends.awaiting


def test_one_backend_alone_names_none_from_its_counters():
    """With one model server there is nothing to tell apart: no backend, no affinity, no summary line."""
    events = [sample(0.0, "r0", 0, 0)] + turn("s1", 1, 1.0, 1.5, 1000) + [sample(2.0, "r0", 1000, 1)]
    state = fold(events)
    assert served(state) == [("s1", 1, None, None)]
    rep = build_report(state)
    assert rep.affinity is None and affinity_lines(rep) == []


def test_a_router_endpoint_counts_its_workers_across_its_restart_and_stays_out_of_the_totals():
    def router(t: float, a: float, b: float) -> ev.MetricsSample:
        workers = {"http://10.0.0.1:8000": a, "http://10.0.0.2:8000": b}
        return ev.MetricsSample(
            t=t, source="router", engine="vllm-router", values={"router_requests": a + b}, workers=workers
        )

    state = fold([router(0.0, 0, 0), router(1.0, 3, 2), router(2.0, 1, 0), sample(2.0, "r0", 500, 1)])
    rep = build_report(state)
    fig = next(f for f in rep.servers if f.name == "router")
    # Named by the endpoints at their URLs; the restart's reset never counts backwards (its interval adds nothing,
    # as for every counter of an endpoint).
    assert fig.workers == {"r0": 3.0, "r1": 2.0}
    assert "router_requests" not in state.server.values  # a router's figures are not a model server's


def test_moves_count_changes_of_backend_in_turn_order():
    assert moves_of({1: "r0", 2: "r0", 3: "r1"}) == 1
    assert moves_of({3: "r1", 1: "r0", 2: "r1", 4: "r0"}) == 2  # r0 r1 r1 r0
    assert moves_of({}) == 0


ROUTER_SCRAPES = {
    # vllm-router 0.1.17's names (ENGINES.md §1.11); SGLang's older sgl-router (sgl-router/src/metrics.rs), which
    # vllm-router forked, the same under its prefix
    **{
        engine: (
            f"# TYPE {p}requests_total counter\n"
            f'{p}requests_total{{route="/v1/chat/completions"}} 7\n'
            f'{p}requests_total{{route="/v1/models"}} 1\n'
            f'{p}processed_requests_total{{worker="http://10.0.0.1:8000"}} 4\n'
            f'{p}processed_requests_total{{worker="http://10.0.0.2:8000"}} 3\n'
            f'{p}worker_health{{worker="http://10.0.0.1:8000"}} 1\n'
            f'{p}retries_total{{route="/v1/chat/completions"}} 2\n'
            f'{p}request_errors_total{{route="/v1/chat/completions",error_type="timeout"}} 1\n'
        )
        for p, engine in (("vllm_router_", "vllm-router"), ("sgl_router_", "sgl-router"))
    },
    # sglang-router 0.3.2 (SGLang's model gateway), as its Prometheus port served it here: smg_ names, a worker's
    # requests as its circuit breaker's outcomes
    "sglang-router": (
        "# TYPE smg_router_requests_total counter\n"
        'smg_router_requests_total{router_type="http",model="m",endpoint="chat",streaming="true"} 7\n'
        'smg_router_requests_total{router_type="http",model="m",endpoint="chat",streaming="false"} 1\n'
        'smg_worker_selection_total{worker_type="regular",model="m",policy="round_robin"} 8\n'
        'smg_worker_cb_outcomes_total{worker="http://10.0.0.1:8000",outcome="success"} 3\n'
        'smg_worker_cb_outcomes_total{worker="http://10.0.0.1:8000",outcome="failure"} 1\n'
        'smg_worker_cb_outcomes_total{worker="http://10.0.0.2:8000",outcome="success"} 3\n'
        'smg_worker_health{worker="http://10.0.0.1:8000"} 1\n'
        'smg_worker_retries_total{worker="http://10.0.0.1:8000",attempt="1"} 2\n'
        'smg_router_request_errors_total{router_type="http",model="m",error_type="upstream"} 1\n'
    ),
}


@pytest.mark.parametrize("engine", sorted(ROUTER_SCRAPES))
def test_a_router_scrape_is_read_as_its_requests_in_all_and_per_worker(engine):
    """Each router's names: its requests in all, retried and failed, and per worker; either is a router to the fold."""
    from rampwatch.drivers.model.endpoints import ROUTER_ENGINES, EndpointView, is_router
    from rampwatch.drivers.telemetry.metrics import ROUTERS, detect, normalize, router_workers

    text = ROUTER_SCRAPES[engine]
    profile = detect(text)
    want = {"router_requests": 8.0, "router_retries": 2.0, "router_errors": 1.0}
    assert normalize(text) == (engine, want, {})  # lacks no model figure: it has none
    assert router_workers(text, profile) == {"http://10.0.0.1:8000": 4.0, "http://10.0.0.2:8000": 3.0}
    assert is_router(EndpointView(name="gw", engine=engine))
    assert {p.engine for p in ROUTERS} == set(ROUTER_ENGINES)  # one list of router engines for both layers


def test_a_backend_whose_scrape_fails_leaves_no_turn_waiting_and_none_guessed():
    """r1's /metrics stops answering: its sample after the turn never comes. The turn is told at once, as
    ambiguous (r1's counters cannot say it was not there), not kept waiting until the run ends."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + [ev.MetricsError(t=1.8, source="r1", error="connection refused")]
    events += [sample(2.0, "r0", 1000, 1)]
    state = RunState(HEADER)
    for e in events:
        state.apply(e)
    assert served(state) == [("s1", 1, None, "ambiguous")] and not state.backends.awaiting
    # While it fails it is no backend: the next turn is told by r0's counters alone (fewer than two: not at all).
    for e in turn("s1", 2, 3.0, 3.5, 2000) + [sample(4.0, "r0", 3000, 2)]:
        state.apply(e)
    assert served(state)[1] == ("s1", 2, None, None) and not state.backends.awaiting


def test_of_several_that_moved_the_one_that_moved_by_exactly_the_prompt_is_named_when_nothing_overlapped():
    """Both moved (r0 by something the client did not send, a health probe's prompt): r1 moved by exactly this
    turn's 1,000 tokens and one request, and no other turn was in flight, so r1 served it."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + [sample(2.0, "r0", 7, 1), sample(2.0, "r1", 1000, 1)]
    assert served(fold(events)) == [("s1", 1, "r1", "counters")]


def test_a_lone_mover_that_moved_by_less_than_the_turns_prompt_is_not_named():
    """Only r0 moved, by 7 tokens: that was not this 1,000-token turn (its own count had not come yet)."""
    events = [sample(0.0, "r0", 0, 0), sample(0.0, "r1", 0, 0)]
    events += turn("s1", 1, 1.0, 1.5, 1000) + [sample(2.0, "r0", 7, 1), sample(2.0, "r1", 0, 0)]
    assert served(fold(events)) == [("s1", 1, None, "ambiguous")]


def test_the_reports_router_line_says_what_it_retried_and_failed_since_it_first_answered():
    """The router's counters grow from its first sample: 2 retries after it. Its error series and r1's requests
    appear only with their first count (as a router creates them): counted from zero, not from that first value."""

    def router(t: float, retries: float, errors: float | None, r1: float | None) -> ev.MetricsSample:
        values = {"router_requests": 10 * t, "router_retries": retries}
        values |= {"router_errors": errors} if errors is not None else {}
        workers = {"http://10.0.0.1:8000": 5 * t} | ({"http://10.0.0.2:8000": r1} if r1 is not None else {})
        return ev.MetricsSample(t=t, source="router", engine="vllm-router", values=values, workers=workers)

    rep = build_report(fold([router(1.0, 3, None, None), router(2.0, 5, 1, 4)]))
    (r,) = [f for f in rep.servers if f.workers is not None]
    assert (r.router_retries, r.router_errors) == (2.0, 1.0)
    assert router_lines(rep) == ["router router: r0 5 · r1 4 requests, 2 retried, 1 failed"]
