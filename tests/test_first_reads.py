"""A run's first turn goes after every server's first scrape (answered or failed, or after a bounded wait): the
backends' counters then have a sample before it to move from. CI once failed on a race with the first scrape:
of two sessions in lockstep, one was sent before the second replica's first sample, so its turn 1 had no
counters to tell its backend by (tests/test_router_vllm.py, `served_by_source` None)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.run.samplers import Samplers
from rampwatch.drivers.sim.profiles import make_profile
from tests.simhost import TextServer, ThreadedSim

VLLM_METRICS = (Path(__file__).resolve().parent / "data" / "vllm-0.32.0-cpu-metrics.txt").read_text()


def one_turn(sim_url: str, metrics_urls: list[str]) -> list[ev.AnyEvent]:
    cfg = RunConfig(url=sim_url, gpu="none", metrics_urls=metrics_urls, schedule=[512], output_tokens=4)
    run = Run(cfg, record=False, keep_events=True)

    async def main() -> int:
        await run.prepare()
        return await run.drive()

    assert asyncio.run(main()) == 0
    return run.hub.events


def test_the_first_turn_waits_for_a_slow_servers_first_sample(monkeypatch):
    monkeypatch.setattr(Samplers, "SAY_WAITING_AFTER_S", 3.0)  # a wait under it says nothing, with room to spare

    def slow(path: str) -> str:
        time.sleep(0.5)
        return VLLM_METRICS

    with ThreadedSim(make_profile("tiny")) as sim, TextServer(slow) as late:
        events = one_turn(sim.url, [f"sim={sim.url}/metrics", f"late=http://{late.host}/metrics"])
    sent = next(e.t for e in events if isinstance(e, ev.RequestSent))
    first = {}
    for e in events:
        if isinstance(e, ev.MetricsSample):
            first.setdefault(e.source, e.t)
    assert set(first) == {"sim", "late"} and max(first.values()) <= sent, (first, sent)
    assert not [e for e in events if isinstance(e, ev.Notice)]  # within SAY_WAITING_AFTER_S: nothing to say


def test_a_server_that_never_answers_holds_the_first_turn_no_longer_than_the_bound(monkeypatch):
    """The wait says whom it waits for once it is long, and gives up at the bound."""
    monkeypatch.setattr(Samplers, "FIRST_READ_WAIT_S", 0.3)
    monkeypatch.setattr(Samplers, "SAY_WAITING_AFTER_S", 0.1)
    release = threading.Event()

    def hung(path: str) -> str:
        release.wait(20)
        return VLLM_METRICS

    with ThreadedSim(make_profile("tiny")) as sim, TextServer(hung) as stuck:
        try:
            events = one_turn(sim.url, [f"stuck=http://{stuck.host}/metrics"])  # alone: what is said names it alone
        finally:
            release.set()
    sent = next(e.t for e in events if isinstance(e, ev.RequestSent))
    assert 0.3 <= sent < 2.0, sent  # the bound, not the scrape's own 2-s timeout
    assert any(isinstance(e, ev.TurnDone) and e.status == "ok" for e in events)
    said = [(e.level, e.message) for e in events if isinstance(e, ev.Notice)]
    assert said == [
        ("info", "waiting for the first answer from stuck: the first turn waits up to 0.3 s"),
        ("warn", "no first answer from stuck in 0.3 s: the run starts anyway"),
    ], said
    waited = next(e.t for e in events if isinstance(e, ev.Notice))
    assert waited < sent  # said while the first turn waited
