"""A worker and its coordinator from different rampwatch versions: a coordinator that cannot read the events a
worker writes (an older one would drop TokenTimes.counts and count a read's tokens as one) is refused by the
worker, and a worker that writes what its coordinator cannot read is refused by the coordinator, each in one line
that says what to do."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from rampwatch.drivers.client.prompts import Lead
from rampwatch.drivers.client.ramp import Calibration
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.workers import WorkerPool
from tests.test_workers_restart import ScriptedWorker

PLAN = ww.SessionPlan(salt="s", model="m", calibration=Calibration(), lead=Lead(), sessions=1)
CONFIG = RunConfig(url="http://127.0.0.1:1", schedule=[1024], workers=1)


def test_a_worker_refuses_a_coordinator_that_cannot_read_its_events():
    """An older coordinator's start message says no schema: the worker process says why in one line, exits 2."""
    start = ww.WorkerStart(config=CONFIG, plan=PLAN, worker=0, workers=1, sessions=[1], schema=ev.SCHEMA)
    line = ww.encode(start)
    older = line.replace(b',"schema":%d' % ev.SCHEMA, b"")
    assert older != line
    p = subprocess.run(
        [sys.executable, "-m", "rampwatch.drivers.run.worker"], input=older + b"\n", capture_output=True, timeout=60
    )
    err = p.stderr.decode()
    assert p.returncode == 2 and "install the same rampwatch" in err and "Traceback" not in err, err
    assert f"recording schema {ev.SCHEMA}, the coordinator reads schema 1 at most" in err, err


def never_begins(link: ScriptedWorker, begin: object) -> None:
    raise AssertionError("a refused worker is never told to begin")


class NewerWorker(ScriptedWorker):
    """A worker from a newer rampwatch: its events are of a schema this coordinator does not know."""

    def start(self, message: ww.WorkerStart, on_line, on_exit) -> None:  # noqa: ANN001
        self.start_message, self.on_line, self.on_exit = message, on_line, on_exit
        self.say(ww.Hello(worker=message.worker, pid=1000, node="node-b", schema=ev.SCHEMA + 1))


def test_a_coordinator_refuses_a_worker_whose_events_it_cannot_read():
    pool = WorkerPool(
        CONFIG, PLAN, lambda e, line=None: None, RunClock(), TurnGate(1), lambda i: NewerWorker(i, never_begins), 1
    )
    with pytest.raises(RuntimeError) as refused:
        asyncio.run(asyncio.wait_for(pool.run(), 10))
    said = str(refused.value)
    assert said.startswith("worker 0 on node-b: ") and "install the same rampwatch" in said, said
    assert f"schema {ev.SCHEMA + 1}, the coordinator reads schema {ev.SCHEMA} at most" in said, said
