"""A run in this process with line output (for scripts, CI, --web and sweeps): prepare, announce, drive
to the end or to Ctrl-C/SIGTERM, then the report. What prints the lines and what serves the browser UI
are handed in by the caller, so this never imports the UI."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run import event_loop, lifetime
from rampwatch.drivers.run.config import BadInput, RunConfig
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.run.serve_metrics import start_exporter
from rampwatch.drivers.telemetry.client_metrics import ClientMetrics


class LinePrinter(Protocol):
    """Prints the state's new lines when called (after each event), and progress on a timer."""

    def __call__(self, event: object = None) -> None: ...

    def progress(self, now: float) -> None: ...


class Closable(Protocol):
    def close(self) -> None: ...


@dataclass
class Serving:
    """What a headless run serves beside itself: the browser UI (--web), its own metrics (--serve-metrics)."""

    web: Closable | None = None
    exporter: ClientMetrics | None = None

    def close(self) -> None:
        if self.web is not None:
            self.web.close()
        if self.exporter is not None:
            self.exporter.close()


def run_headless(
    cfg: RunConfig,
    record: bool,
    printer_for: Callable[[RunState], LinePrinter],
    final_report: Callable[[RunState], str],
    open_web: Callable[[Run], Closable | None] | None = None,
    stop_when: Callable[[RunState], str | None] | None = None,
) -> tuple[Run, Serving]:
    """The whole run; `open_web(run)`, once the run is prepared (its recording exists), starts the browser UI;
    `final_report(state)` is the table printed at the end of a run that drove sessions (presentation is the
    caller's); `stop_when(state)`, asked once a second, ends the run early with its reason (a sweep's saturated
    point). The caller closes what is served (after letting it linger, if it likes)."""
    run = Run(cfg, record=record)
    run.stop_when = stop_when
    serving = Serving()

    async def main() -> int:
        try:
            await run.prepare()
            if open_web is not None:
                serving.web = open_web(run)
            serving.exporter = start_exporter(cfg, lambda: run.state, run.clock, run.salt)
        except BadInput:
            serving.close()
            await run.aclose()
            raise
        if serving.exporter is not None:
            run.hub.listeners.append(serving.exporter)
        print(announcement(cfg, run), flush=True)
        assert run.state is not None
        return await drive_headless(run, printer_for(run.state))

    run.exit_code = event_loop.run(main())
    assert run.state is not None
    if cfg.mode != "watch":
        print(final_report(run.state))
    if run.recording_path:
        print(f"recording: {run.recording_path}", file=sys.stderr)
    if run.hub.recorder is not None and run.hub.recorder.error:
        print(f"rampwatch: {run.hub.recorder.error}", file=sys.stderr)
    ended = run.state.ended
    if ended is not None and ended.status == "crashed":
        print(f"rampwatch: crashed: {ended.error}", file=sys.stderr)
    return run, serving


def announcement(cfg: RunConfig, run: Run) -> str:
    """The first line of a headless run: what it drives, which model, where it records, which modes are on."""
    path = run.recording_path
    where = f", recording to {path}" if path else ""
    info = run.info
    modes = [
        m
        for m in (
            "TLS NOT VERIFIED (--insecure)" if cfg.insecure else "",
            "lockstep" if cfg.lockstep else "",
            "one-shot baseline" if cfg.one_shot else "",
            "strict needle" if cfg.strict_needle else "",
            f"reasoning {cfg.reasoning}" if cfg.reasoning != "auto" else "",  # as the UI's header says them
            f"max {cfg.max_tokens} tok" if cfg.max_tokens else "",
            f"time limit {cfg.time_limit:g}s" if cfg.time_limit else "",
        )
        if m
    ]
    return (
        f"rampwatch {cfg.mode}: {cfg.base_url} model {info.model if info else '?'} "
        f"({(info.engine if info else None) or 'engine from /metrics'}){where}"
        + (f"; {', '.join(modes)}" if modes else "")
    )


async def drive_headless(run: Run, printer: LinePrinter) -> int:
    """Drive the run with `printer` listening; SIGINT/SIGTERM/SIGHUP end it as the run's own interruption (its
    status and exit code say which), not as an exception out of asyncio.run."""
    run.hub.listeners.append(printer)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    lifetime.handle_stop_signals(loop, lambda sig: run.interrupt(task, sig))

    async def progress() -> None:
        while True:
            await asyncio.sleep(1.0)
            now = run.clock()
            printer.progress(run.state.modelled_time(now) if run.state is not None else now)

    ticker = asyncio.create_task(progress())
    try:
        drive = asyncio.create_task(run.drive())
        try:
            return await asyncio.shield(drive)
        except asyncio.CancelledError:
            drive.cancel()
            return await drive
    finally:
        ticker.cancel()
        printer()
