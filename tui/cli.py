"""The `rampwatch` command: run, watch, replay, report, demo, sim, compare, sweep, export.

Exit codes: 0 done, 1 done with failed turns, 2 bad input, 3 crashed (the
driver died or raised), 129/130/143 interrupted (SIGHUP, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import rampwatch.drivers as drivers
from rampwatch.drivers.telemetry.metrics import redact_url
from rampwatch.drivers.client.ramp import ScheduleError, parse_schedule, parse_tokens, scale_schedule
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.compare import compare
from rampwatch.drivers.model import picture
from rampwatch.drivers.model.analysis import Report
from rampwatch.drivers.model.report import COMPARE_COLUMNS, FORMATS, render, render_comparison, render_curve, summary_lines
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run import lifetime
from rampwatch.drivers.run.config import BadInput, RunConfig, default_record_path, load_api_key, parse_duration, parse_pin
from rampwatch.drivers.run.process import DriverCrashed, DriverProcess
from rampwatch.drivers.run.recording import Recorder, Recording, RecordingError, read_recording
from rampwatch.drivers.run.runner import EXIT_CRASHED, Run
from rampwatch.drivers.run.sweep import SweepFile, read_sweep, why_stop, write_sweep
from rampwatch.drivers.sim.serve import ChildSim, add_fault_args, add_sim_args, serve
from rampwatch.drivers.sim.server import loopback_socket
from rampwatch.drivers.sim.gpus import DCGM_PATH
from rampwatch.drivers.sim.topology import Topology
from rampwatch.drivers.telemetry.exporter import RunExporter, parse_listen
from rampwatch.drivers.telemetry.prometheus import Match, parse_match, parse_matchers
from rampwatch.tui.headless import HeadlessPrinter
from rampwatch.tui.web import WebServer, page_command

EXIT_BAD_INPUT = 2
# The glm-like profile at 10x: a full two-session 1M ramp in about two minutes.
DEMO_TIME_SCALE = 10.0


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line on stderr and exit 2, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except BadInput as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def fail(message: str) -> int:
    print(f"rampwatch: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def add_record_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--record", type=Path, metavar="PATH",
                   help="write the recording here (default: recordings/<time>-<model>.jsonl)")
    g.add_argument("--no-record", action="store_true", help="do not write a recording")


def add_server_watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-url", action="append", default=None, metavar="[ROLE:][NAME=]URL",
                   help="a /metrics endpoint to scrape, repeatable: NAME labels it (default host:port), ROLE is "
                        "prefill, decode or both (default); e.g. prefill:p0=http://10.0.0.1:8000/metrics "
                        "(default: each server's URL/metrics)")
    p.add_argument("--gpu", action="append", default=None, metavar="auto|none|URL",
                   help="GPU source: auto = NVML when present, none, or a dcgm-exporter /metrics URL; repeatable, one "
                        "URL per node (GPUs are labelled by the exporter's Hostname, else the URL's host) (default auto)")
    p.add_argument("--prometheus", metavar="URL",
                   help="read server and GPU figures from this Prometheus server's HTTP API (engines' vllm:/sglang:/"
                        "llamacpp: series unless --metrics-url, DCGM_FI_DEV_* unless --gpu; one endpoint per instance)")
    p.add_argument("--prometheus-match", action="append", default=None, metavar="[ROLE:]MATCHERS",
                   help="with --prometheus: read only the engines these PromQL label matchers select, repeatable, ROLE "
                        "prefill, decode or both (default); e.g. 'prefill:job=\"llm-prefill\"' (default: every engine)")
    p.add_argument("--prometheus-gpu-match", metavar="MATCHERS",
                   help="with --prometheus: read only the dcgm-exporter GPUs these label matchers select, e.g. "
                        "'Hostname=~\"gpu-node-(1|2)\"' (default: every GPU)")
    p.add_argument("--serve-metrics", metavar="[HOST:]PORT",
                   help="expose rampwatch's own figures (TTFT, decode tok/s, gaps, prefill in flight, turns, needle) "
                        "for Prometheus at http://HOST:PORT/metrics (HOST default 127.0.0.1)")
    p.add_argument("--scrape-interval", type=_positive_float, default=0.5, metavar="S",
                   help="seconds between /metrics scrapes (default 0.5)")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="read the API key from this environment variable (default: OPENAI_API_KEY when set)")
    p.add_argument("--api-key-file", metavar="PATH", help="read the API key from this file (first line)")
    p.add_argument("--ca-bundle", type=Path, metavar="PATH",
                   help="trust these CA certificates (PEM) for https URLs, instead of certifi's bundle")
    p.add_argument("--insecure", action="store_true",
                   help="verify no TLS certificate (said in the header, the recording and the output)")
    p.add_argument("--headless", action="store_true", help="line output instead of the UI (for scripts and CI)")
    add_web_arg(p)
    add_record_args(p)


def add_web_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web", metavar="[HOST:]PORT",
                   help="serve the UI in a browser at http://HOST:PORT (textual-serve; HOST default 127.0.0.1); "
                        "this terminal gets the line output")


def _session_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of session counts: {text!r} (e.g. 1,2,4,8)") from None
    if not counts or any(c < 1 for c in counts) or counts != sorted(set(counts)):
        raise argparse.ArgumentTypeError(f"session counts must be growing whole numbers >= 1: {text!r}")
    return counts


def add_ramp_args(p: argparse.ArgumentParser, sessions_default: int = 1, lockstep_default: bool = False,
                  sweep: bool = False) -> None:
    p.add_argument("--model", help="model to ask for (default: the first of /v1/models)")
    if sweep:
        p.add_argument("--sessions", type=_session_counts, required=True, metavar="N,N,...",
                       help="session counts to run, in lockstep, one after the other (e.g. 1,2,4,8)")
    else:
        p.add_argument("--sessions", type=_positive_int, default=sessions_default, metavar="N",
                       help=f"conversations to run at once (default {sessions_default})")
    p.add_argument("--stagger", type=_positive_float, default=0.0, metavar="S",
                   help="seconds between the starts of consecutive sessions (default 0)")
    p.add_argument("--schedule", default="seed", metavar="seed|LIST",
                   help="context tokens per turn: 'seed' (32k,64k,128k,+128k…,1m) or a list like 32k,64k,128k")
    p.add_argument("--scale-to", metavar="TOKENS",
                   help="same shape, last turn at TOKENS (for servers with a shorter max context), e.g. 32k")
    p.add_argument("--output-tokens", type=_positive_int, default=128, metavar="N",
                   help="tokens to ask for each turn (default 128)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="ask the server to generate exactly --output-tokens (ignore_eos / min_tokens)")
    p.add_argument("--retries", type=int, default=0, metavar="N", help="retry a failed turn N times (default 0)")
    p.add_argument("--request-timeout", type=_positive_float, default=3600.0, metavar="S",
                   help="longest wait for a turn, prefill included (default 3600)")
    p.add_argument("--reconnect-timeout", type=_positive_float, default=180.0, metavar="S",
                   help="how long sessions wait for a vanished server to come back (default 180)")
    p.add_argument("--record-text", action="store_true",
                   help="keep prompt and reply text in the recording (default: sizes, salts and hashes only)")
    p.add_argument("--lockstep", action=argparse.BooleanOptionalAction, default=lockstep_default,
                   help="turn k+1 of any session starts only when turn k of every live session has finished "
                        f"(default {'on' if lockstep_default else 'off'})")
    p.add_argument("--one-shot", action="store_true",
                   help="after the ramp, send one fresh prompt as long as its last turn (unshared salt: no cache hit) "
                        "as a baseline; with a one-turn --schedule, only that prompt")
    p.add_argument("--strict-needle", action="store_true",
                   help="re-send replies with the needle's code masked, so the only copy stays in turn 1 "
                        "(default: replies go back verbatim, as in a real conversation)")
    p.add_argument("--time-limit", type=_duration, metavar="DURATION",
                   help="start no new turn after this long, e.g. 40s, 90m, 2h (the run ends with status time-limit)")
    p.add_argument("--grace", type=_positive_float, default=0.0, metavar="S",
                   help="with --time-limit: cancel turns still in flight S seconds after the limit (default 0: let them finish)")


def _topology(text: str) -> str:
    try:
        Topology.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_topology_arg(p: argparse.ArgumentParser, flag: str) -> None:
    p.add_argument(flag, type=_topology, default="single", metavar="single|replicas:N|pd",
                   help="simulated deployment: one engine (default), N replicas the sessions are spread over, or a "
                        "prefill/decode split behind a proxy (each engine with its own /metrics)")


def add_pin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pin", action="append", default=[], metavar="SESSION=URL",
                   help="send a session's turns to one of the servers (its URL or name), e.g. s1=http://10.0.0.2:8000 "
                        "(repeatable; the others go round-robin)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="rampwatch",
        description="Drive growing long-context conversations against an OpenAI-compatible server and watch them.",
    )
    parser.add_argument("--version", action="version", version=f"rampwatch {drivers.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="drive ramps against one or more servers and watch them live")
    p.add_argument("url", metavar="URL", nargs="+",
                   help="server base URL, e.g. http://127.0.0.1:8000; several: sessions are spread over them round-robin")
    add_ramp_args(p)
    add_pin_arg(p)
    add_server_watch_args(p)

    p = sub.add_parser("watch", help="watch servers' metrics and GPUs without sending traffic")
    p.add_argument("url", metavar="URL", nargs="*", help="server base URL (several: one endpoint each; none with --prometheus)")
    add_server_watch_args(p)

    p = sub.add_parser("demo", help="run a ramp against the built-in simulated engine (no GPU, no network)")
    add_ramp_args(p, sessions_default=2, lockstep_default=True)
    add_sim_args(p, default_profile="glm-like")
    add_topology_arg(p, "--topology")
    # Exactly --output-tokens a turn, so decode (and its interference) stays visible.
    # 8 simulated GPUs per engine, so the GPUs panel shows load that follows the engine's steps.
    p.set_defaults(time_scale=DEMO_TIME_SCALE, ignore_eos=True, gpus=8)
    p.add_argument("--headless", action="store_true", help="line output instead of the UI")
    add_web_arg(p)
    add_record_args(p)

    p = sub.add_parser("sim", help="serve the simulated engine (vLLM's HTTP surface) for any client")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key-env", metavar="VAR", help="require this environment variable's value as a Bearer API key")
    add_sim_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--replicas", type=_positive_int, metavar="N",
                   help="N engines on ports PORT..PORT+N-1, each with its own /metrics")
    g.add_argument("--pd", action="store_true",
                   help="a prefill/decode split: a proxy on PORT (send turns here), the prefill engine on PORT+1, "
                        "the decode engine on PORT+2 (each with /metrics); the KV moves with a modelled transfer time")
    add_fault_args(p)

    p = sub.add_parser("replay", help="replay a recording in the UI")
    p.add_argument("path", type=Path, metavar="PATH")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="playback speed, 0.25 to 64 (default 1)")
    p.add_argument("--headless", action="store_true", help="print the run's turn lines instead of the UI")
    p.add_argument("--follow", action="store_true",
                   help="show a run as its recording grows (a run in progress, e.g. started by someone else)")
    add_web_arg(p)
    p.add_argument("--skip-bad-lines", action="store_true", help="read past corrupt lines instead of stopping")

    p = sub.add_parser("compare", help="recordings side by side (a sweep file counts as its runs)")
    p.add_argument("paths", type=Path, nargs="+", metavar="RUN")
    p.add_argument("--format", choices=FORMATS, default="table", help="table (default), md, csv or json")
    p.add_argument("--baseline", metavar="RUN", help="the run the per-turn ratios divide by: its path or label (default the first)")
    p.add_argument("--label", action="append", default=[], metavar="NAME",
                   help="a label per run, in order (repeatable; default model@engine)")
    p.add_argument("--html", type=Path, metavar="OUT", help="also write the table and a TTFT-per-turn chart as one HTML page")
    p.add_argument("--skip-bad-lines", action="store_true", help="read past corrupt lines instead of stopping")

    p = sub.add_parser("export", help="pictures of a recording (a self-contained HTML page, SVG); the Grafana dashboard")
    p.add_argument("path", type=Path, metavar="RUN", nargs="?")
    p.add_argument("--grafana-dashboard", type=Path, metavar="OUT",
                   help="write the Grafana dashboard for --serve-metrics (with vLLM's metrics beside) as JSON")
    p.add_argument("--html", type=Path, metavar="OUT", help="the timeline, TTFT against context and the summary, as HTML")
    p.add_argument("--svg", type=Path, metavar="OUT", help="the timeline and the TTFT chart as one SVG")
    p.add_argument("--skip-bad-lines", action="store_true", help="read past corrupt lines instead of stopping")

    p = sub.add_parser("sweep", help="the same ramp at several session counts, in lockstep: a capacity curve")
    p.add_argument("url", metavar="URL", nargs="+", help="server base URL (several: sessions spread round-robin)")
    add_ramp_args(p, sweep=True)
    add_server_watch_args(p)

    p = sub.add_parser("report", help="per-turn tables of a recording")
    p.add_argument("path", type=Path, metavar="PATH")
    p.add_argument("--format", choices=FORMATS, default="table", help="table (default), md, csv or json")
    p.add_argument("--skip-bad-lines", action="store_true", help="read past corrupt lines instead of stopping")
    return parser


def schedule_from(args: argparse.Namespace) -> list[int]:
    schedule = parse_schedule(args.schedule)
    if args.scale_to:
        schedule = scale_schedule(schedule, parse_tokens(args.scale_to))
    return schedule


def config_from(args: argparse.Namespace, mode: str, argv: list[str]) -> RunConfig:
    gpus = args.gpu or ([] if args.prometheus else ["auto"])  # with --prometheus the GPUs come from it
    if len(gpus) > 1 and any("://" not in g for g in gpus):
        raise BadInput("--gpu auto or none cannot be combined with other --gpu sources")
    for g in gpus:
        if g not in ("auto", "none") and "://" not in g:
            raise BadInput(f"--gpu {g!r}: use auto, none or a dcgm-exporter URL like http://node1:9400/metrics")
    urls = args.url if isinstance(args.url, list) else [args.url]
    if not urls and args.prometheus:
        urls = [args.prometheus]  # watching only through Prometheus: the header names it
    if not urls:
        raise BadInput("give a server URL, or --prometheus URL to watch through Prometheus")
    if args.serve_metrics:
        try:
            parse_listen(args.serve_metrics)
        except ValueError as e:
            raise BadInput(f"--serve-metrics: {e}") from None
    for url in urls + ([args.prometheus] if args.prometheus else []):
        if "://" not in url:
            raise BadInput(f"not a URL: {url!r} (e.g. http://127.0.0.1:8000)")
    matches, gpu_matchers = prometheus_selection(args)
    cfg = RunConfig(
        url=urls[0],
        more_urls=urls[1:],
        pins=dict(parse_pin(p) for p in getattr(args, "pin", None) or []),
        mode=mode,
        metrics_urls=args.metrics_url or [],
        gpu=gpus,
        scrape_interval=max(0.05, args.scrape_interval),
        record=args.record,
        api_key=load_api_key(args.api_key_env, args.api_key_file),
        command=scrub_argv(argv),
        ca_bundle=args.ca_bundle,
        insecure=args.insecure,
        prometheus=args.prometheus,
        prometheus_match=matches,
        prometheus_gpu_match=gpu_matchers,
        serve_metrics=args.serve_metrics,
    )
    if mode != "watch":
        cfg.model = args.model
        cfg.sessions = args.sessions
        cfg.stagger = args.stagger
        cfg.schedule = schedule_from(args)
        cfg.output_tokens = args.output_tokens
        cfg.ignore_eos = args.ignore_eos
        cfg.retries = max(0, args.retries)
        cfg.request_timeout = args.request_timeout
        cfg.reconnect_timeout = args.reconnect_timeout
        cfg.record_text = args.record_text
        cfg.lockstep = args.lockstep
        cfg.one_shot = args.one_shot
        cfg.strict_needle = args.strict_needle
        cfg.time_limit = args.time_limit
        cfg.grace = args.grace
    return cfg


def prometheus_selection(args: argparse.Namespace) -> tuple[list[Match], str]:
    """--prometheus-match and --prometheus-gpu-match, checked: what Prometheus is asked for."""
    if (args.prometheus_match or args.prometheus_gpu_match) and not args.prometheus:
        raise BadInput("--prometheus-match and --prometheus-gpu-match need --prometheus URL")
    if args.prometheus and args.metrics_url and args.gpu:
        raise BadInput("--prometheus would read nothing: --metrics-url and --gpu name every source (drop one of them)")
    if args.prometheus_match and args.metrics_url:
        raise BadInput("--prometheus-match reads the engines from Prometheus, --metrics-url scrapes them: use one")
    if args.prometheus_gpu_match and args.gpu:
        raise BadInput("--prometheus-gpu-match reads the GPUs from Prometheus, --gpu names them: use one")
    try:
        matches = [parse_match(m) for m in args.prometheus_match or []]
    except ValueError as e:
        raise BadInput(f"--prometheus-match: {e}") from None
    try:
        return matches, parse_matchers(args.prometheus_gpu_match or "")
    except ValueError as e:
        raise BadInput(f"--prometheus-gpu-match: {e}") from None


def scrub_argv(argv: list[str]) -> list[str]:
    """The command line as recorded: credentials in URLs removed."""
    return ["rampwatch", *(redact_url(a) if "://" in a else a for a in argv)]


async def _drive_headless(run: Run) -> int:
    assert run.state is not None
    printer = HeadlessPrinter(run.state)
    run.hub.listeners.append(printer)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def interrupt(sig: int) -> None:
        run.interrupted_by = sig
        task.cancel()

    lifetime.handle_stop_signals(loop, interrupt)

    async def progress() -> None:
        while True:
            await asyncio.sleep(1.0)
            printer.progress(run.clock())

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


def execute_run(cfg: RunConfig, record: bool, headless: bool, web: str | None = None) -> int:
    """Headless: the run in this process, line output. With the UI: the run in
    a driver process of its own, the UI folding its event stream. With --web:
    headless here, and the UI in browsers, each page following the recording."""
    if web:
        if not record:
            raise BadInput("--web shows the run from its recording: drop --no-record")
        return _execute_headless(cfg, record, web)
    if headless:
        return _execute_headless(cfg, record)
    from rampwatch.tui.app import run_app_live

    driver = DriverProcess(cfg, record=record)
    print(f"rampwatch {cfg.mode}: connecting to {cfg.base_url} …", file=sys.stderr, flush=True)
    try:
        driver.start()
    except DriverCrashed as e:
        print(f"rampwatch: {e}", file=sys.stderr)
        return EXIT_CRASHED
    export_from_ui(cfg, driver)
    code = run_app_live(driver)
    ended = driver.state.ended
    if ended is not None and ended.status == "crashed":
        details = driver.stderr_text().strip()
        if details:
            print(details, file=sys.stderr)
        print(f"rampwatch: crashed: {ended.error}", file=sys.stderr)
    if driver.recording:
        print(f"recording: {driver.recording}", file=sys.stderr)
    return code


def export_from_ui(cfg: RunConfig, driver: DriverProcess) -> RunExporter | None:
    """--serve-metrics with the UI: the UI process serves the driver's figures (it stays up after the
    run, for a last scrape)."""
    exporter = start_exporter(cfg, driver.now, driver.state.header.salt if driver.state.header else "")
    if exporter is not None:
        driver.listeners.append(exporter)
    return exporter


def start_exporter(cfg: RunConfig, clock: Callable[[], float], run: str) -> RunExporter | None:
    """--serve-metrics: rampwatch's own figures for Prometheus, served from this process."""
    if not cfg.serve_metrics:
        return None
    host, port = parse_listen(cfg.serve_metrics)
    exporter = RunExporter(clock, run=run)
    try:
        exporter.serve(host, port)
    except OSError as e:
        raise BadInput(f"--serve-metrics {cfg.serve_metrics}: cannot listen: {e.strerror or e}") from None
    print(f"rampwatch: serving its own metrics on http://{host}:{exporter.port}/metrics", file=sys.stderr, flush=True)
    return exporter


EXPORTER_LINGER_S = 15.0  # headless: how long the final figures stay up for a last scrape


def serve_web(listen: str, command: str, title: str, secret: str | None = None) -> WebServer:
    """Start the browser UI (BadInput when it cannot listen) and say where it is."""
    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise BadInput(f"--web: {e}") from None
    server = WebServer(command, host, port, title, secret=secret)
    problem = server.wait_ready()
    if problem is not None:
        server.close()
        raise BadInput(f"--web {listen}: {problem}")
    print(f"rampwatch: the UI is at {server.url} (from a laptop: ssh -L {port}:127.0.0.1:{port} THIS-HOST, "
          f"then open http://127.0.0.1:{port})", file=sys.stderr, flush=True)
    return server


def serve_until_interrupted(server: WebServer, why: str) -> None:
    print(f"rampwatch: {why}; still serving {server.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


@dataclass
class Serving:
    """What a headless run serves beside itself: the browser UI (--web), its own metrics (--serve-metrics)."""

    web: WebServer | None = None
    exporter: RunExporter | None = None

    def close(self) -> None:
        if self.web is not None:
            self.web.close()
        if self.exporter is not None:
            self.exporter.close()


def _execute_headless(cfg: RunConfig, record: bool, web: str | None = None) -> int:
    run, serving = _run_headless(cfg, record, web)
    if serving.web is not None:
        serve_until_interrupted(serving.web, f"the run {run.state.ended.status if run.state and run.state.ended else 'ended'}")
    if serving.exporter is not None and cfg.mode != "watch":
        print(f"rampwatch: its metrics stay up {EXPORTER_LINGER_S:.0f} s for a last scrape (Ctrl-C to leave now)",
              file=sys.stderr, flush=True)
        try:
            time.sleep(EXPORTER_LINGER_S)
        except KeyboardInterrupt:
            pass
    serving.close()
    return run.exit_code


def _run_headless(cfg: RunConfig, record: bool, web: str | None = None) -> tuple[Run, Serving]:
    run = Run(cfg, record=record)
    serving = Serving()

    async def main() -> int:
        try:
            await run.prepare()
            if web and run.recording_path is not None:
                serving.web = serve_web(web, page_command(run.recording_path, follow=True), f"rampwatch {cfg.mode}",
                                        cfg.api_key)
            serving.exporter = start_exporter(cfg, run.clock, run.salt)
        except BadInput:
            serving.close()
            await run.aclose()
            raise
        if serving.exporter is not None:
            run.hub.listeners.append(serving.exporter)
        path = run.recording_path
        where = f", recording to {path}" if path else ""
        info = run.info
        modes = [m for m in ("TLS NOT VERIFIED (--insecure)" if cfg.insecure else "",
                             "lockstep" if cfg.lockstep else "", "one-shot baseline" if cfg.one_shot else "",
                             "strict needle" if cfg.strict_needle else "",
                             f"time limit {cfg.time_limit:g}s" if cfg.time_limit else "") if m]
        print(f"rampwatch {cfg.mode}: {cfg.base_url} model {info.model if info else '?'} "
              f"({(info.engine if info else None) or 'engine from /metrics'}){where}"
              + (f"; {', '.join(modes)}" if modes else ""), flush=True)
        return await _drive_headless(run)

    run.exit_code = asyncio.run(main())
    assert run.state is not None
    if cfg.mode != "watch":
        print(render(build_report(run.state), "table"))
    if run.recording_path:
        print(f"recording: {run.recording_path}", file=sys.stderr)
    if run.hub.recorder is not None and run.hub.recorder.error:
        print(f"rampwatch: {run.hub.recorder.error}", file=sys.stderr)
    ended = run.state.ended
    if ended is not None and ended.status == "crashed":
        print(f"rampwatch: crashed: {ended.error}", file=sys.stderr)
    return run, serving


def read_noting(path: Path, skip_bad_lines: bool) -> Recording:
    """Read a recording; what had to be skipped is said on stderr."""
    rec = read_recording(path, skip_bad_lines=skip_bad_lines)
    if rec.truncated_tail:
        print("rampwatch: note: the last line was cut off (a killed run); read up to the last complete event", file=sys.stderr)
    if rec.skipped_lines:
        print(f"rampwatch: note: skipped corrupt lines: {', '.join(map(str, rec.skipped_lines[:10]))}", file=sys.stderr)
    return rec


def load_state(path: Path, skip_bad_lines: bool, listener: Callable[[RunState], None] | None = None) -> RunState:
    """Fold a recording into a RunState (calling `listener(state)` after each event)."""
    rec = read_noting(path, skip_bad_lines)
    state = RunState(rec.header)
    for e in rec.events:
        state.apply(e)
        if listener is not None:
            listener(state)
    return state


def cmd_compare(args: argparse.Namespace) -> int:
    paths: list[Path] = []
    for path in args.paths:
        paths += read_sweep(path) or [path]
    if args.label and len(args.label) != len(paths):
        return fail(f"{len(args.label)} --label for {len(paths)} runs: give one per run, in order")
    runs = []
    for k, path in enumerate(paths):
        state = load_state(path, args.skip_bad_lines)
        rep = build_report(state)
        h = state.header
        label = args.label[k] if args.label else f"{rep.run.model or '?'}@{rep.run.engine or '?'}"
        ramp = [s for s in state.sessions.values() if s.role == "ramp"]
        runs.append((label, str(path), rep, (h.engine_version or "") if h else "", ramp[0].schedule if ramp else []))
    labels = [r[0] for r in runs]
    if len(set(labels)) < len(labels):  # default labels of same-model runs: tell them apart
        runs = [(f"{label} #{k + 1}", *rest) for k, (label, *rest) in enumerate(runs)]
    baseline = 0
    if args.baseline:
        names = [[r[0], r[1], str(Path(r[1]).name)] for r in runs]
        match = [k for k, n in enumerate(names) if args.baseline in n or str(Path(args.baseline)) in n]
        if not match:
            return fail(f"--baseline {args.baseline}: not one of the runs compared")
        baseline = match[0]
    cmp = compare(runs, baseline)
    sys.stdout.write(render_comparison(cmp, args.format))
    if args.html:
        fields = [(name, [cell(r) for r in cmp.runs]) for name, cell in COMPARE_COLUMNS]
        return _write(args.html, picture.compare_html(cmp, fields))
    return 0


def _write(path: Path, text: str) -> int:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        return fail(f"cannot write {path}: {e.strerror or e}")
    print(f"wrote {path} ({len(text.encode()) / 1024:,.0f} KB)", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.grafana_dashboard:
        dashboard = (Path(__file__).parent / "grafana-dashboard.json").read_text()
        code = _write(args.grafana_dashboard, dashboard)
        if code or args.path is None:
            return code
    if args.path is None:
        return fail("export needs a recording (RUN), or --grafana-dashboard OUT")
    if not args.html and not args.svg:
        return fail("export needs --html OUT and/or --svg OUT")
    rec = read_noting(args.path, args.skip_bad_lines)
    series = picture.fold(rec.header, rec.events)
    code = 0
    if args.html:
        code = code or _write(args.html, picture.run_html(series, summary_lines(build_report(series.state))))
    if args.svg:
        code = code or _write(args.svg, picture.run_svg(series))
    return code


def cmd_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    """Each session count in turn, in lockstep, recorded; stops when the server starts to fail or preempt."""
    counts: list[int] = args.sessions
    if args.web:
        return fail("--web is for run, watch, demo and replay; a sweep prints its curve (replay its recordings with --web)")
    sweep_path = None if args.no_record else (args.record or default_record_path("sweep").with_suffix(".sweep.json"))
    if sweep_path is not None:
        if args.record is None:
            sweep_path.parent.mkdir(parents=True, exist_ok=True)  # the default folder; a --record folder must exist
        problem = Recorder.check_path(sweep_path)
        if problem:
            return fail(problem)
    sweep = SweepFile(sessions=counts, runs=[])
    points: list[tuple[int, Report, float | None]] = []
    for n in counts:
        args.sessions = n
        cfg = config_from(args, "run", argv)
        cfg.lockstep = True
        if sweep_path is not None:
            cfg.record = sweep_path.with_name(f"{sweep_path.name.removesuffix('.sweep.json')}-{n}s.jsonl")
        print(f"rampwatch sweep: {n} session(s)", flush=True)
        run, serving = _run_headless(cfg, record=sweep_path is not None)
        serving.close()  # the next point serves on the same port
        assert run.state is not None
        points.append((n, build_report(run.state), run.state.preemptions_this_run()))
        if sweep_path is not None and run.recording_path is not None:
            sweep.runs.append(run.recording_path.name)
            write_sweep(sweep_path, sweep)
        if run.exit_code in (129, 130, 143, EXIT_CRASHED):
            return run.exit_code
        sweep.stopped = why_stop(run.state)
        if sweep.stopped:
            print(f"rampwatch sweep: stopped: {sweep.stopped}", flush=True)
            break
    if sweep_path is not None:
        write_sweep(sweep_path, sweep)
        print(f"sweep: {sweep_path}", file=sys.stderr)
    print(render_curve(points))
    return 1 if sweep.stopped and "failed" in sweep.stopped else 0


def cmd_report(args: argparse.Namespace) -> int:
    sys.stdout.write(render(build_report(load_state(args.path, args.skip_bad_lines)), args.format))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    if not 0.25 <= args.speed <= 64:
        return fail("--speed must be between 0.25 and 64")
    if args.web or args.follow:  # bad input is one line, before a server or a UI opens
        read_recording(args.path, skip_bad_lines=args.skip_bad_lines)
    if args.web:
        server = serve_web(args.web, page_command(args.path, follow=args.follow, speed=args.speed), "rampwatch replay")
        serve_until_interrupted(server, f"serving {'the growing' if args.follow else 'a replay of'} {args.path}")
        return 0
    if args.follow:
        from rampwatch.tui.app import run_app_follow

        return run_app_follow(args.path)
    if args.headless:
        printers: list[HeadlessPrinter] = []

        def show(state: RunState) -> None:  # the same lines the live run printed, event by event
            if not printers:
                printers.append(HeadlessPrinter(state))
            printers[0]()

        state = load_state(args.path, args.skip_bad_lines, show)
        if state.header is not None and state.header.mode != "watch":
            print(render(build_report(state), "table"))
        return 0
    from rampwatch.tui.app import run_app_replay

    return run_app_replay(read_recording(args.path, skip_bad_lines=args.skip_bad_lines), speed=args.speed)


def cmd_demo(args: argparse.Namespace, argv: list[str]) -> int:
    args.url = "http://127.0.0.1"  # replaced by the child's address below
    args.metrics_url, args.gpu, args.scrape_interval, args.api_key_env, args.api_key_file = None, None, 0.5, None, None
    args.ca_bundle, args.insecure, args.prometheus, args.serve_metrics = None, False, None, None
    args.prometheus_match, args.prometheus_gpu_match = None, None
    cfg = config_from(args, "demo", argv)  # validate before starting anything
    try:
        child = ChildSim(args)
        child.wait_ready()
    except (OSError, RuntimeError) as e:
        return fail(f"cannot start the simulated engine: {e}")
    try:
        topology = Topology.parse(args.topology)
        targets, cfg.metrics_urls = topology.targets(child.urls)
        cfg.url, cfg.more_urls = targets[0], targets[1:]
        if args.gpus:
            cfg.gpu = [engine + DCGM_PATH for engine in topology.engines(child.urls)]
        return execute_run(cfg, record=not args.no_record, headless=args.headless, web=args.web)
    finally:
        child.__exit__()


def cmd_sim(args: argparse.Namespace) -> int:
    args.topology = "pd" if args.pd else f"replicas:{args.replicas}" if args.replicas else "single"
    socks = []
    for k in range(Topology.parse(args.topology).sockets):
        try:
            socks.append(loopback_socket(args.host, args.port + k))
        except OSError as e:
            return fail(f"cannot listen on {args.host}:{args.port + k}: {e.strerror or e}")
    serve(args, socks)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    lifetime.stop_on_signals()  # SIGTERM and SIGHUP unwind like Ctrl-C: the children started below are stopped
    try:
        if args.command in ("run", "watch"):
            cfg = config_from(args, args.command, argv)
            return execute_run(cfg, record=not args.no_record, headless=args.headless, web=args.web)
        if args.command == "demo":
            return cmd_demo(args, argv)
        if args.command == "sim":
            return cmd_sim(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "sweep":
            return cmd_sweep(args, argv)
        if args.command == "export":
            return cmd_export(args)
        if args.command == "replay":
            return cmd_replay(args)
    except (BadInput, ScheduleError, RecordingError) as e:
        return fail(str(e))
    except KeyboardInterrupt:
        return 130
    return fail(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
