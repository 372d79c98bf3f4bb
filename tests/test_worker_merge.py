"""The coordinator's merge of the workers' events (drivers/run/spread.py), against scripted workers (no process):
events go on in time order even when one worker's lines reach it late, as far as every running worker has sent
its own (ww.Through), and a worker a second or more behind is said in a notice."""

from __future__ import annotations

import asyncio

from rampwatch.drivers.client.prompts import Lead
from rampwatch.drivers.client.ramp import Calibration
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.hub import EventHub
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.spread import HOLD_S, MAX_HOLD_S, Spread, release_point
from rampwatch.drivers.run.workers import WorkerPool
from tests.test_workers_restart import ScriptedWorker

LATE_S = 1.2  # how late worker 1's lines reach the coordinator


def test_the_release_point_follows_the_slowest_worker_within_bounds():
    assert release_point(100.0, 99.95) == 99.95 - HOLD_S  # on time: a pipe flush behind
    assert release_point(100.0, 97.0) == 97.0 - HOLD_S  # a worker three seconds behind holds the rest back
    assert release_point(100.0, float("inf")) == 100.0 - HOLD_S  # no running worker has said: the least hold
    assert release_point(100.0, 10.0) == 100.0 - MAX_HOLD_S  # never longer than MAX_HOLD_S


def test_a_late_workers_events_are_merged_in_time_order_and_said():
    clock = RunClock()
    hub = EventHub(None, keep_events=True)
    spread = Spread(hub, clock)

    def script(link: ScriptedWorker, begin: object) -> None:
        """Marks every 20 ms for 2 s, each with the Through after it; worker 1's reach the coordinator late."""

        async def talk() -> None:
            late = LATE_S if link.index == 1 else 0.0
            for _ in range(100):
                await asyncio.sleep(0.02)
                t = clock() - late
                link.say(ev.Mark(t=t, note=f"w{link.index}"))
                link.say(ww.Through(t=t))
            link.say(ww.WorkerDone(failed=False))

        asyncio.get_running_loop().create_task(talk())

    async def main() -> None:
        cfg = RunConfig(url="http://127.0.0.1:1", schedule=[1024], workers=2)
        plan = ww.SessionPlan(salt="s", model="m", calibration=Calibration(), lead=Lead(), sessions=2)
        hub.hold()
        spread._pool = pool = WorkerPool(
            cfg, plan, hub.emit, clock, TurnGate(2), lambda i: ScriptedWorker(i, script), 2, lambda: None
        )
        releasing = asyncio.create_task(spread.release_loop())
        await asyncio.wait_for(pool.run(), 10)
        releasing.cancel()
        hub.release()

    asyncio.run(main())
    marks = [e for e in hub.events if isinstance(e, ev.Mark)]
    assert len(marks) == 200
    times = [e.t for e in hub.events]
    assert times == sorted(times)  # w1's marks, 1.2 s late, among w0's, not after them
    said = [e.message for e in hub.events if isinstance(e, ev.Notice) and "late" in e.message]
    assert len(said) == 1 and "events reach the coordinator 1." in said[0] and "not keep" not in said[0], said
