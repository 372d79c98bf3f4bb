"""Starting a run (run, watch, demo): in the UI with a driver process of its own, or headless here with
line output, or headless with the UI served to browsers (--web) from the recording."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.report import render, report_title
from rampwatch.drivers.present.summary import EACH_SESSION_MAX, summary_lines
from rampwatch.drivers.run.config import BadInput, RunConfig
from rampwatch.drivers.run.exitcodes import EXIT_CRASHED
from rampwatch.drivers.run.headless import run_headless
from rampwatch.drivers.run.process import DriverCrashed, DriverProcess
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.run.serve_metrics import linger_for_last_scrape, start_exporter
from rampwatch.drivers.telemetry.client_metrics import ClientMetrics
from rampwatch.tui.cli.web_option import serve_until_interrupted, serve_web
from rampwatch.tui.headless_lines import HeadlessPrinter
from rampwatch.tui.refresh import REFRESH_S

if TYPE_CHECKING:
    from rampwatch.tui.web_server import WebServer


def execute_run(
    cfg: RunConfig, record: bool, headless: bool, web: str | None = None, refresh_s: float = REFRESH_S
) -> int:
    """Headless: the run in this process, line output. With the UI: the run in
    a driver process of its own, the UI folding its event stream (redrawn every
    refresh_s). With --web: headless here, and the UI in browsers, each page
    following the recording."""
    if web:
        if not record:
            raise BadInput("--web shows the run from its recording: drop --no-record")
        return execute_headless(cfg, record, web, refresh_s)
    if headless:
        return execute_headless(cfg, record)
    from rampwatch.tui.app import run_app_live

    driver = DriverProcess(cfg, record=record)
    print(f"rampwatch {cfg.mode}: connecting to {cfg.base_url} …", file=sys.stderr, flush=True)
    try:
        driver.start()
    except DriverCrashed as e:
        print(f"rampwatch: {e}", file=sys.stderr)
        return EXIT_CRASHED
    export_from_ui(cfg, driver)
    code = run_app_live(driver, refresh_s)
    ended = driver.state.ended
    if ended is not None and ended.status == "crashed":
        details = driver.stderr_text().strip()
        if details:
            print(details, file=sys.stderr)
        print(f"rampwatch: crashed: {ended.error}", file=sys.stderr)
    if driver.recording:
        print(f"recording: {driver.recording}", file=sys.stderr)
    return code


def export_from_ui(cfg: RunConfig, driver: DriverProcess) -> ClientMetrics | None:
    """--serve-metrics with the UI: the UI process serves the driver's figures (it stays up after the
    run, for a last scrape)."""
    exporter = start_exporter(
        cfg, lambda: driver.state, lambda: driver.clock(), driver.state.header.salt if driver.state.header else ""
    )
    if exporter is not None:
        driver.listeners.append(exporter)
    return exporter


def report_table(state: RunState) -> str:
    """The tables a headless run prints at its end (`rampwatch report` prints them from its recording); a run of
    more sessions than the summary lists one by one (a trace's thousands) prints its summary alone."""
    rep = build_report(state)
    if len(rep.sessions) > EACH_SESSION_MAX:
        return "\n".join([report_title(rep.run), *summary_lines(rep)]) + "\n"
    return render(rep, "table")


def execute_headless(cfg: RunConfig, record: bool, web: str | None = None, refresh_s: float = REFRESH_S) -> int:
    """The run here with HeadlessPrinter's lines (and the UI in browsers with --web, each page redrawn
    every refresh_s); after it, --web keeps serving until Ctrl-C and --serve-metrics stays up for a last
    scrape."""
    servers: list[WebServer] = []

    def open_web(run: Run) -> WebServer | None:
        if web is None or run.recording_path is None:
            return None
        from rampwatch.tui.web_server import page_command

        servers.append(
            serve_web(
                web,
                page_command(run.recording_path, follow=True, refresh_s=refresh_s),
                f"rampwatch {cfg.mode}",
                (cfg.api_key, cfg.metrics_token),
            )
        )
        return servers[0]

    run, serving = run_headless(cfg, record, HeadlessPrinter, report_table, open_web if web else None)
    if run.interrupted_by is not None:  # a signal ended the run: nothing lingers or goes on serving
        serving.close()
        return run.exit_code
    if servers:
        serve_until_interrupted(
            servers[0], f"the run {run.state.ended.status if run.state and run.state.ended else 'ended'}"
        )
    if serving.exporter is not None and cfg.mode != "watch":
        linger_for_last_scrape()
    serving.close()
    return run.exit_code
