"""The argument spec: every command, flag, help text, default and choice (docs/cli.md is generated from it).

Each command's flags are added when that command is parsed (or its help shown), so `rampwatch report`
never imports the simulator that `demo` and `sim` take their flags from.

It is longer than the other modules (~500 lines) on purpose: the whole command line in one place, read top to
bottom as the reference it generates; the commands themselves live one a module beside it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rampwatch.drivers as drivers
from rampwatch.drivers.present.report import FORMATS
from rampwatch.tui.cli.argtypes import duration, positive_float, positive_int, session_counts, share, topology
from rampwatch.tui.cli.errors import BadArguments

# The glm-like profile at 10x: a full two-session 1M ramp in about two minutes.
DEMO_TIME_SCALE = 10.0
# Two UI redraws a second: figures stay fresh to the eye, and a two-session ramp writes ~3 KB/s to a 120x40
# terminal (tests/bench_terminal.py), light enough for an SSH link through a jump host.
REFRESH_S = 0.5


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments raise BadArguments (one line, exit 2 in main), not a usage dump; a command's
    flags are added by `populate` the first time the command is parsed or its help is shown."""

    def __init__(self, *args: Any, populate: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any):
        # No abbreviated flags: a value is scrubbed from the recorded command by its flag's full name.
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self._populate = populate

    def populated(self) -> OneLineParser:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        return super(OneLineParser, self.populated()).parse_known_args(args, namespace)

    def format_help(self) -> str:
        return super(OneLineParser, self.populated()).format_help()

    def format_usage(self) -> str:
        return super(OneLineParser, self.populated()).format_usage()

    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadArguments(f"{self.prog}: {message} (see {self.prog} --help)")


def add_record_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--record",
        type=Path,
        metavar="PATH",
        help="write the recording here (default: recordings/<time>-<model>.jsonl)",
    )
    g.add_argument("--no-record", action="store_true", help="do not write a recording")


def add_server_watch_args(p: argparse.ArgumentParser, ui: bool = True) -> None:
    """The flags of every command that drives or watches servers; `ui`: it can show the UI (sweep cannot)."""
    p.add_argument(
        "--metrics-url",
        action="append",
        default=None,
        metavar="[ROLE:][NAME=]URL",
        help="a /metrics endpoint to scrape, repeatable: NAME labels it (default host:port), ROLE is "
        "prefill, decode or both (default); e.g. prefill:p0=http://10.0.0.1:8000/metrics "
        "(default: each server's URL/metrics)",
    )
    p.add_argument(
        "--gpu",
        action="append",
        default=None,
        metavar="auto|none|URL",
        help="GPU source: auto = NVML when present, none, or a dcgm-exporter /metrics URL; repeatable, one "
        "URL per node (GPUs are labelled by the exporter's Hostname, else the URL's host) (default auto)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="read server and GPU figures from this Prometheus server's HTTP API (engines' vllm:/sglang:/"
        "llamacpp: series unless --metrics-url, DCGM_FI_DEV_* unless --gpu; one endpoint per instance)",
    )
    p.add_argument(
        "--prometheus-match",
        action="append",
        default=None,
        metavar="[ROLE:]MATCHERS",
        help="with --prometheus: read only the engines these PromQL label matchers select, repeatable, ROLE "
        "prefill, decode or both (default); e.g. 'prefill:job=\"llm-prefill\"' (default: every engine)",
    )
    p.add_argument(
        "--prometheus-gpu-match",
        metavar="MATCHERS",
        help="with --prometheus: read only the dcgm-exporter GPUs these label matchers select, e.g. "
        "'Hostname=~\"gpu-node-(1|2)\"' (default: every GPU)",
    )
    add_serve_metrics_arg(p)
    p.add_argument(
        "--otlp",
        metavar="[HOST:]PORT",
        help="receive the engine's OTLP/HTTP trace spans (protobuf, POST /v1/traces) on this port and join each to "
        "its turn: queued, prefill and decode per turn without per-request metrics (HOST default 127.0.0.1; vLLM: "
        "--otlp-traces-endpoint http://HOST:PORT/v1/traces with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)",
    )
    p.add_argument(
        "--scrape-interval",
        type=positive_float,
        default=0.5,
        metavar="S",
        help="seconds between /metrics scrapes (default 0.5)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="read the API key from this environment variable (default: OPENAI_API_KEY when set)",
    )
    p.add_argument("--api-key-file", metavar="PATH", help="read the API key from this file (first line)")
    p.add_argument(
        "--metrics-auth-env",
        metavar="VAR",
        help="send this environment variable's value as a Bearer token to metrics and GPU URLs (the API "
        "key goes to the inference servers only; user:password@ in a metrics URL goes as Basic auth)",
    )
    p.add_argument(
        "--ca-bundle",
        type=Path,
        metavar="PATH",
        help="trust these CA certificates (PEM) for https URLs, instead of certifi's bundle",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="verify no TLS certificate (said in the header, the recording and the output)",
    )
    p.add_argument("--headless", action="store_true", help="line output instead of the UI (for scripts and CI)")
    if ui:
        add_refresh_arg(p)
    add_web_arg(p)
    add_record_args(p)


def add_serve_metrics_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--serve-metrics",
        metavar="[HOST:]PORT",
        help="expose rampwatch's own figures (TTFT, decode tok/s, gaps, prefill in flight, turns, needle) "
        "for Prometheus at http://HOST:PORT/metrics (HOST default 127.0.0.1)",
    )


def add_refresh_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--refresh",
        type=positive_float,
        default=REFRESH_S,
        metavar="SECONDS",
        help="redraw the UI every SECONDS (default 0.5: a two-session ramp writes ~3 KB/s to a 120x40 "
        "terminal; raise it on a slow SSH link)",
    )


def add_web_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--web",
        metavar="[HOST:]PORT",
        help="serve the UI in a browser at http://HOST:PORT (textual-serve; HOST default 127.0.0.1); "
        "this terminal gets the line output",
    )


def add_ramp_args(
    p: argparse.ArgumentParser, sessions_default: int = 1, lockstep_default: bool = False, sweep: bool = False
) -> None:
    p.add_argument("--model", help="model to ask for (default: the first of /v1/models)")
    if sweep:
        p.add_argument(
            "--sessions",
            type=session_counts,
            metavar="N,N,...",
            help="closed loop: session counts to run, in lockstep, one after the other (e.g. 1,2,4,8); with "
            "--arrivals or --find-max one N: at most N conversations a point (default: as many as arrive)",
        )
    else:
        p.add_argument(
            "--sessions",
            type=positive_int,
            default=sessions_default,
            metavar="N",
            help=f"conversations to run at once (default {sessions_default})",
        )
    p.add_argument(
        "--stagger",
        type=positive_float,
        default=0.0,
        metavar="S",
        help="seconds between the starts of consecutive sessions (default 0)",
    )
    p.add_argument(
        "--schedule",
        default="seed",
        metavar="seed|LIST",
        help="context tokens per turn: 'seed' (32k,64k,128k,+128k…,1m) or a list like 32k,64k,128k",
    )
    p.add_argument(
        "--scale-to",
        metavar="TOKENS",
        help="same shape, last turn at TOKENS (for servers with a shorter max context), e.g. 32k",
    )
    p.add_argument(
        "--output-tokens", type=positive_int, default=128, metavar="N", help="tokens to ask for each turn (default 128)"
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        metavar="N",
        help="cap on all a turn generates, reasoning and answer together (default: --output-tokens, the answer "
        "budget); e.g. 4096 for a model that thinks",
    )
    p.add_argument(
        "--reasoning",
        choices=("off", "on", "auto"),
        default="auto",
        help="thinking of reasoning models: off or on sends chat_template_kwargs enable_thinking and thinking "
        "false or true (Qwen3, DeepSeek V3.1, GLM templates); auto sends nothing, the server's default (default)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask the server to generate exactly --output-tokens (ignore_eos / min_tokens)",
    )
    p.add_argument(
        "--extra-body",
        metavar="JSON|@FILE",
        help="request options merged into every chat request, e.g. '{\"top_k\": 20}' or "
        '\'{"chat_template_kwargs": {"enable_thinking": false}}\' (keys rampwatch sets itself are refused)',
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an HTTP header for the inference servers, repeatable; {session}, {turn} and {run} are filled in "
        "per request, e.g. 'x-session-id: {session}' for a router's session affinity (credential headers are "
        "never recorded or printed)",
    )
    p.add_argument("--retries", type=int, default=0, metavar="N", help="retry a failed turn N times (default 0)")
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=3600.0,
        metavar="S",
        help="longest wait for a turn, prefill included (default 3600)",
    )
    p.add_argument(
        "--reconnect-timeout",
        type=positive_float,
        default=180.0,
        metavar="S",
        help="how long sessions wait for a vanished server to come back (default 180)",
    )
    p.add_argument(
        "--record-text",
        action="store_true",
        help="keep prompt and reply text in the recording (default: sizes, salts and hashes only)",
    )
    p.add_argument(
        "--lockstep",
        action=argparse.BooleanOptionalAction,
        default=lockstep_default,
        help="turn k+1 of any session starts only when turn k of every live session has finished "
        f"(default {'on' if lockstep_default else 'off'})",
    )
    p.add_argument(
        "--one-shot",
        action="store_true",
        help="after the ramp, send one fresh prompt as long as its last turn (unshared salt: no cache hit) "
        "as a baseline; with a one-turn --schedule, only that prompt",
    )
    p.add_argument(
        "--strict-needle",
        action="store_true",
        help="re-send replies with the needle's code masked, so the only copy stays in turn 1 "
        "(default: replies go back verbatim, as in a real conversation)",
    )
    p.add_argument(
        "--time-limit",
        type=duration,
        metavar="DURATION",
        help="start no new turn after this long, e.g. 40s, 90m, 2h (the run ends with status time-limit)",
    )
    p.add_argument(
        "--grace",
        type=positive_float,
        default=0.0,
        metavar="S",
        help="with --time-limit: cancel turns still in flight S seconds after the limit (default 0: let them finish)",
    )
    add_prompt_shape_args(p)


def add_prompt_shape_args(p: argparse.ArgumentParser) -> None:
    """How the prompts are made: a shared lead, real text, the user's pauses."""
    p.add_argument(
        "--system-prompt",
        metavar="TEXT|@FILE",
        help="a system message every session opens with (the same text: sessions share its prefix), "
        "e.g. @prompts/system.txt",
    )
    p.add_argument(
        "--shared-prefix",
        metavar="TOKENS",
        help="a block of TOKENS tokens every session of the run shares, after the system prompt and before "
        "its own salt, e.g. 8k (counted in each turn's target)",
    )
    p.add_argument(
        "--corpus",
        type=Path,
        metavar="PATH",
        help="read the conversations' new text from this file or directory of text or code files (read "
        "recursively, sorted; binary files skipped; each session starts at its own place, wrapping at the end) "
        "instead of pseudo-words",
    )
    p.add_argument(
        "--think-time",
        metavar="S|A..B",
        help="the user's pause between a reply and the next turn, e.g. 10s, or drawn uniformly from a range "
        "like 5s..30s (seeded by the run's salt); with --lockstep the barrier first, then each session's pause",
    )


def add_topology_arg(p: argparse.ArgumentParser, flag: str) -> None:
    p.add_argument(
        flag,
        type=topology,
        default="single",
        metavar="single|replicas:N|pd",
        help="simulated deployment: one engine (default), N replicas the sessions are spread over, or a "
        "prefill/decode split behind a proxy (each engine with its own /metrics)",
    )


def add_pin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="SESSION=URL",
        help="send a session's turns to one of the servers (its URL or name), e.g. s1=http://10.0.0.2:8000 "
        "(repeatable; the others go round-robin)",
    )


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "url",
        metavar="URL",
        nargs="+",
        help="server base URL, e.g. http://127.0.0.1:8000; several: sessions are spread over them round-robin",
    )
    add_ramp_args(p)
    add_open_loop_args(p)
    add_pin_arg(p)
    add_server_watch_args(p)


def add_open_loop_args(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """Arriving users and the latency they were promised (run, and sweep's open loop)."""
    if sweep:
        p.add_argument(
            "--arrivals",
            metavar="RATES|LOW..HIGH",
            help="open loop: a point per arrival rate, each run for --time-limit, e.g. 0.5,1,2,4/min (a unit on "
            "the last rate applies to all); with --find-max the range searched, e.g. 0.5..8/min (default "
            "0.25..8/min)",
        )
    else:
        p.add_argument(
            "--arrivals",
            metavar="RATE",
            help="open loop: a new conversation (a full ramp) at each arrival of a Poisson process of RATE, e.g. "
            "2/min, 0.5/s, 30/h (a plain number is per minute), until --sessions have started or --time-limit; "
            "latency counts from when each turn was due (not with --lockstep or --stagger)",
        )
    p.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="seed of the arrival times (default: drawn, and recorded in the header so the run can be repeated)",
    )
    p.add_argument(
        "--max-live",
        type=positive_int,
        metavar="N",
        help="with --arrivals: at most N conversations live at once; later arrivals wait, and their wait counts",
    )
    p.add_argument(
        "--slo",
        metavar="BOUNDS",
        help="per-turn objectives, any of ttft, answer (first answer token), gap (worst inter-token gap), tpot "
        "(mean time per output token), e.g. ttft=90s,gap=1s,tpot=100ms; ttft may scale with the turn's new "
        "tokens: ttft=0.7ms/token. Each turn gets a verdict; goodput counts the turns meeting every bound",
    )
    p.add_argument(
        "--warmup",
        metavar="DURATION|N",
        help="with --slo: leave the run's start out of the figures (goodput, late turns, a sweep point's turns/min "
        "and TTFT), a time (e.g. 60s: turns due before it) or the first N arrivals (e.g. 3: conversations "
        "s1..s3); the report says what was left out",
    )


def add_watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "url", metavar="URL", nargs="*", help="server base URL (several: one endpoint each; none with --prometheus)"
    )
    add_server_watch_args(p)


def add_demo_args(p: argparse.ArgumentParser) -> None:
    from rampwatch.drivers.sim.serve import add_sim_args

    add_ramp_args(p, sessions_default=2, lockstep_default=True)
    add_sim_args(p, default_profile="glm-like")
    add_topology_arg(p, "--topology")
    # Exactly --output-tokens a turn, so decode (and its interference) stays visible.
    # 8 simulated GPUs per engine, so the GPUs panel shows load that follows the engine's steps.
    # The engine's own timing of every request, so each TTFT reads as queued + prefill + the rest.
    p.set_defaults(time_scale=DEMO_TIME_SCALE, ignore_eos=True, gpus=8, enable_per_request_metrics=True)
    p.add_argument("--headless", action="store_true", help="line output instead of the UI")
    add_refresh_arg(p)
    add_serve_metrics_arg(p)
    add_web_arg(p)
    add_record_args(p)


def add_sim_command_args(p: argparse.ArgumentParser) -> None:
    from rampwatch.drivers.sim.serve import add_fault_args, add_sim_args

    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key-env", metavar="VAR", help="require this environment variable's value as a Bearer API key")
    add_sim_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--replicas",
        type=positive_int,
        metavar="N",
        help="N engines on ports PORT..PORT+N-1, each with its own /metrics",
    )
    g.add_argument(
        "--pd",
        action="store_true",
        help="a prefill/decode split: a proxy on PORT (send turns here), the prefill engine on PORT+1, "
        "the decode engine on PORT+2 (each with /metrics); the KV moves with a modelled transfer time",
    )
    add_fault_args(p)


def add_skip_bad_lines_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-bad-lines", action="store_true", help="read past corrupt lines instead of stopping")


def add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="PATH", help="the recording (.jsonl) to replay")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="playback speed, 0.25 to 64 (default 1)")
    p.add_argument("--headless", action="store_true", help="print the run's turn lines instead of the UI")
    add_refresh_arg(p)
    p.add_argument(
        "--follow",
        action="store_true",
        help="show a run as its recording grows (a run in progress, e.g. started by someone else)",
    )
    add_web_arg(p)
    add_skip_bad_lines_arg(p)


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="recordings (.jsonl) or sweep files (.sweep.json), in the order their columns appear",
    )
    p.add_argument("--format", choices=FORMATS, default="table", help="table (default), md, csv or json")
    p.add_argument(
        "--baseline", metavar="RUN", help="the run the per-turn ratios divide by: its path or label (default the first)"
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="a label per run, in order (repeatable; default model@engine)",
    )
    p.add_argument(
        "--html", type=Path, metavar="OUT", help="also write the table and a TTFT-per-turn chart as one HTML page"
    )
    add_skip_bad_lines_arg(p)


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        type=Path,
        metavar="RUN",
        nargs="?",
        help="the recording (.jsonl) to draw, or an open-loop sweep's file (.sweep.json): its capacity curve",
    )
    p.add_argument(
        "--grafana-dashboard",
        type=Path,
        metavar="OUT",
        help="write the Grafana dashboard for --serve-metrics (with vLLM's metrics beside) as JSON",
    )
    p.add_argument(
        "--html",
        type=Path,
        metavar="OUT",
        help="the timeline, TTFT against context and the summary, as HTML (a sweep: its curve and table)",
    )
    p.add_argument(
        "--svg", type=Path, metavar="OUT", help="the timeline and the TTFT chart as one SVG (a sweep: its curve)"
    )
    add_skip_bad_lines_arg(p)


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", nargs="+", help="server base URL (several: sessions spread round-robin)")
    add_ramp_args(p, sweep=True)
    add_open_loop_args(p, sweep=True)
    add_knee_args(p)
    add_server_watch_args(p, ui=False)


def add_knee_args(p: argparse.ArgumentParser) -> None:
    """sweep --find-max: the search for the highest arrival rate that keeps the SLO."""
    p.add_argument(
        "--find-max",
        action="store_true",
        help="search (bisection on the rate) for the highest arrival rate whose turns meet --slo for at least "
        "--slo-share of them; prints the knee and what the engine's KV pool would have said",
    )
    p.add_argument(
        "--slo-share",
        type=share,
        default=0.95,
        metavar="PCT",
        help="with --find-max: the share of turns that must meet --slo, e.g. 95%% or 0.95 (default 95%%)",
    )
    p.add_argument(
        "--max-points",
        type=positive_int,
        default=6,
        metavar="N",
        help="with --find-max: run at most N points (default 6; at least 3 for a bracket and one bisection)",
    )
    p.add_argument(
        "--saturation-window",
        type=duration,
        default=60.0,
        metavar="DURATION",
        help="an open-loop point ends early, saturated, once the server's waiting queue never emptied and kept "
        "growing for this long (default 60s), or a turn failed, or the server preempted",
    )


def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="PATH", help="the recording (.jsonl) to tabulate")
    p.add_argument("--format", choices=FORMATS, default="table", help="table (default), md, csv or json")
    add_skip_bad_lines_arg(p)


# Every command in the order --help lists them: name, one-line help, the function that adds its flags.
COMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None]]] = [
    ("run", "drive ramps against one or more servers and watch them live", add_run_args),
    ("watch", "watch servers' metrics and GPUs without sending traffic", add_watch_args),
    ("demo", "run a ramp against the built-in simulated engine (no GPU, no network)", add_demo_args),
    ("sim", "serve the simulated engine (vLLM's HTTP surface) for any client", add_sim_command_args),
    ("replay", "replay a recording in the UI", add_replay_args),
    ("compare", "recordings side by side (a sweep file counts as its runs)", add_compare_args),
    ("export", "pictures of a recording (a self-contained HTML page, SVG); the Grafana dashboard", add_export_args),
    (
        "sweep",
        "capacity curves: the same ramp at several session counts in lockstep, or users arriving at several "
        "rates (open loop), or a search for the knee (--find-max: the highest rate that keeps an SLO)",
        add_sweep_args,
    ),
    ("report", "per-turn tables of a recording", add_report_args),
]


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="rampwatch",
        description="Drive growing long-context conversations against an OpenAI-compatible server and watch them.",
    )
    parser.add_argument("--version", action="version", version=f"rampwatch {drivers.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for name, help_text, populate in COMMANDS:
        sub.add_parser(name, help=help_text, description=help_text, populate=populate)
    return parser
