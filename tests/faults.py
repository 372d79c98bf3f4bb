"""Fault scenarios against the simulated engine, shared by test_faults.py
(which asserts) and bench_faults.py (which prints the table)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.profiles import make_profile
from tests.simhost import ThreadedSim

SCHEDULE = [2000, 4000, 6000, 8000]


@dataclass
class Outcome:
    name: str
    exit_code: int
    turns_ok: int
    turns_planned: int
    emitted: int  # events the run produced in memory
    recorded: int  # events read back from its file
    run: Run

    @property
    def events_lost(self) -> int:
        return self.emitted - self.recorded

    @property
    def turns_lost(self) -> int:
        return self.turns_planned - self.turns_ok


def run_scenario(
    name: str,
    tmp: Path,
    faults: SimFaults | None = None,
    during: Callable[[ThreadedSim, Run], Any] | None = None,
    profile: str = "tiny",
    time_scale: float = 1.0,
    **cfg: Any,
) -> Outcome:
    """One 2-session ramp against a fresh sim with `faults`; `during(sim, run)` runs in a thread alongside."""
    rec = tmp / f"{name}.jsonl"
    sim = ThreadedSim(make_profile(profile, time_scale=time_scale), faults=faults or SimFaults())
    sim.__enter__()
    holder = {"sim": sim}
    options = dict(sessions=2, schedule=SCHEDULE, output_tokens=32, ignore_eos=True, scrape_interval=0.2, gpu="none")
    options.update(cfg)
    config = RunConfig(url=sim.url, metrics_urls=[sim.url + "/metrics"], record=rec, **options)
    run = Run(config, keep_events=True)

    async def main() -> int:
        await run.prepare()
        return await run.drive()

    helper = threading.Thread(target=lambda: during(holder, run), daemon=True) if during else None
    try:
        if helper:
            helper.start()
        code = asyncio.run(main())
        if helper:
            helper.join(timeout=60)
    finally:
        holder["sim"].__exit__()
    back = read_recording(rec)
    ok = sum(1 for e in back.events if isinstance(e, ev.TurnDone) and e.status == "ok")
    return Outcome(
        name=name,
        exit_code=code,
        turns_ok=ok,
        turns_planned=options["sessions"] * len(options["schedule"]),
        emitted=len(run.hub.events),
        recorded=len(back.events),
        run=run,
    )


def restart_server(down_for: float, after: float) -> Callable[[dict, Run], None]:
    """Stop the sim `after` seconds into the run and bring a new one up on the same port `down_for` later."""

    def act(holder: dict, run: Run) -> None:
        wait_then(after, lambda h, r: None)(holder, run)
        old = holder["sim"]
        port = old.port
        old.__exit__()
        time.sleep(down_for)
        holder["sim"] = ThreadedSim(make_profile("tiny"), port=port).__enter__()

    return act


def wait_then(seconds: float, fn: Callable[[dict, Run], None]) -> Callable[[dict, Run], None]:
    """Run `fn` `seconds` after the run sent its first request."""

    def act(holder: dict, run: Run) -> None:
        deadline = time.monotonic() + 30
        while not any(isinstance(e, ev.RequestSent) for e in list(run.hub.events)) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(seconds)
        fn(holder, run)

    return act


class FlakyFile:
    """Wraps a recording's file: while `full`, each write lands half its bytes and
    then fails with ENOSPC, as a filling disk does."""

    def __init__(self, f: Any, full: bool = False):
        self.f, self.full = f, full

    def write(self, data: Any) -> int:
        if self.full:
            self.f.write(bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


class BrokenNvml:
    """A pynvml stand-in: one GPU, lost after start: every reading raises NVMLError (GPU_IS_LOST)."""

    class NVMLError(Exception):
        value = 15

    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_UNINITIALIZED = 1
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> object:
        return object()

    def nvmlDeviceGetName(self, h: object) -> str:
        return "NVIDIA Lost"  # found at start; every reading after that fails

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def fail(*a: Any) -> Any:
            raise BrokenNvml.NVMLError("GPU is lost")

        return fail
