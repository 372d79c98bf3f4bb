"""From parsed arguments to a RunConfig, checked: one function per flag family, none of them mutating the
parsed arguments, so demo and sweep build on the same config and derive theirs with dataclasses.replace."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from rampwatch.drivers.client.ramp import parse_schedule, parse_tokens, scale_schedule
from rampwatch.drivers.client.reasoning import with_reasoning
from rampwatch.drivers.client.request_options import parse_extra_body, parse_header
from rampwatch.drivers.model.slo import parse_slo
from rampwatch.drivers.model.warmup import parse_warmup
from rampwatch.drivers.run.arrivals import parse_rate, parse_rate_range, parse_rates
from rampwatch.drivers.run.config import (
    BadInput,
    RunConfig,
    TraceOptions,
    is_http_url,
    load_api_key,
    load_metrics_token,
    parse_pin,
)
from rampwatch.drivers.run.prompt_shape import (
    check_corpus_path,
    load_system_prompt,
    parse_think_time,
    shared_prefix_size,
)
from rampwatch.drivers.run.scrub import scrub_argv, scrub_header_arg
from rampwatch.drivers.run.shards import parse_shard, parse_start_at, parse_workers
from rampwatch.drivers.run.sweep_plan import KneeSearch, OpenLoopPlan
from rampwatch.drivers.telemetry.client_metrics import parse_listen
from rampwatch.drivers.telemetry.prometheus import Match, parse_match, parse_matchers


def config_from(args: argparse.Namespace, mode: str, argv: list[str]) -> RunConfig:
    """run, watch and sweep: servers, what is watched beside them, and (not for watch) the ramp."""
    urls = list(args.url)
    if not urls and args.prometheus:
        urls = [args.prometheus]  # watching only through Prometheus: the header names it
    if not urls:
        raise BadInput("give a server URL, or --prometheus URL to watch through Prometheus")
    for url in urls:
        if not is_http_url(url):
            raise BadInput(f"not a URL: {url!r} (e.g. http://127.0.0.1:8000)")
    watched = watch_settings(args)
    cfg = RunConfig(
        url=urls[0],
        more_urls=urls[1:],
        pins=dict(parse_pin(p) for p in getattr(args, "pin", None) or []),
        mode=mode,
        record=args.record,
        command=recorded_command(argv),
        **watched,
    )
    if mode == "watch":
        return cfg
    return replace(cfg, **{**ramp_settings(args), **open_loop_settings(args), **trace_settings(args)})


def open_loop_settings(args: argparse.Namespace) -> dict[str, Any]:
    """--arrivals, --seed, --max-live and --slo, checked (run and sweep: other commands have none of them); a
    sweep's rate is its first point's."""
    if not hasattr(args, "arrivals"):
        return {}
    plan = open_loop_plan(args)
    rate = (plan.rates or [plan.search.low if plan.search else 0.0])[0] if plan else None
    if args.arrivals is not None and rate is None:
        rate = parse_rate(args.arrivals)
    if rate is not None and args.lockstep:
        raise BadInput("--arrivals starts conversations as users arrive (open loop): --lockstep does not apply")
    if rate is not None and args.stagger:
        raise BadInput("--arrivals times the conversations' starts itself: --stagger does not apply")
    if rate is None and args.max_live is not None:
        raise BadInput("--max-live needs --arrivals RATE")
    if args.slo is not None:
        try:
            parse_slo(args.slo)
        except ValueError as e:
            raise BadInput(f"--slo {args.slo!r}: {e}") from None
    if args.warmup is not None:
        if args.slo is None:
            raise BadInput("--warmup leaves the run's start out of the figures: it needs --slo")
        try:
            parse_warmup(args.warmup)
        except ValueError as e:
            raise BadInput(f"--warmup: {e}") from None
    return dict(arrivals_per_s=rate, seed=args.seed, max_live=args.max_live, slo=args.slo, warmup=args.warmup)


DEFAULT_SEARCH_PER_MIN = (0.25, 8.0)  # --find-max without --arrivals searches from here (and beyond, if need be)


def open_loop_plan(args: argparse.Namespace) -> OpenLoopPlan | None:
    """A sweep's open loop (--arrivals RATES, or --find-max over a range), checked; None for a closed-loop sweep
    or another command."""
    find_max = getattr(args, "find_max", False)
    if hasattr(args, "find_max") and args.trace is not None:
        if find_max:
            raise BadInput("--find-max searches arrival rates; a trace sweeps its speeds: --trace-speed 0.5,1,2,4")
        if args.sessions is not None:
            raise BadInput("--trace replays the trace's own sessions: --sessions does not apply")
        return OpenLoopPlan(saturation_window_s=args.saturation_window, speeds=args.trace_speed)
    if not hasattr(args, "find_max") or (args.arrivals is None and not find_max):
        return None
    if args.time_limit is None:
        raise BadInput("an open-loop sweep runs each rate for --time-limit: give one, e.g. --time-limit 10m")
    if args.sessions is not None and len(args.sessions) > 1:
        raise BadInput("with --arrivals, --sessions is one number: at most that many conversations a point")
    cap = args.sessions[0] if args.sessions else None
    plan = OpenLoopPlan(saturation_window_s=args.saturation_window, sessions=cap, slo_share=args.slo_share)
    if not find_max:
        plan.rates = parse_rates(args.arrivals)
        return plan
    if args.slo is None:
        raise BadInput("--find-max searches for the highest rate that meets an SLO: give --slo, e.g. --slo ttft=5s")
    if args.max_points < 3:
        raise BadInput("--max-points: --find-max needs at least 3 points (a bracket and one bisection)")
    low, high = (
        parse_rate_range(args.arrivals) if args.arrivals is not None else (r / 60 for r in DEFAULT_SEARCH_PER_MIN)
    )
    plan.search = KneeSearch(low, high, max_points=args.max_points)
    return plan


def demo_config(args: argparse.Namespace, argv: list[str]) -> RunConfig:
    """demo: the ramp and --serve-metrics; the servers, their /metrics and GPUs are the simulator's, filled in
    once it listens (the URL here is a placeholder). OPENAI_API_KEY, when set, is still the key (it also
    guards --web's page), as for run."""
    return RunConfig(
        url="http://127.0.0.1",
        mode="demo",
        record=args.record,
        command=recorded_command(argv),
        api_key=load_api_key(None, None),
        serve_metrics=listen_setting("--serve-metrics", args.serve_metrics),
        gpu=["auto"],
        time_scale=args.time_scale if args.time_scale not in (None, 1.0) else None,  # modelled time (model/modelled.py)
        **{**ramp_settings(args), **trace_settings(args)},
    )


# The --trace-* flags (as argparse names them) and their defaults: any other value needs --trace.
TRACE_FLAG_DEFAULTS: dict[str, object] = {
    "trace_format": "auto",
    "trace_block_size": None,
    "trace_kv_tokens": None,
    "trace_start": 0.0,
    "trace_duration": None,
    "trace_sessions": None,
    "trace_max_context": None,
    "trace_skip_bad": False,
    "trace_api": "completions",
    "trace_timing": "session",
    "trace_speed": 1.0,
    "trace_warm": False,
}


def trace_settings(args: argparse.Namespace) -> dict[str, Any]:
    """--trace and its flags, checked against what a trace decides itself (its sessions, sizes and times)."""
    if getattr(args, "trace", None) is None:
        used = [
            flag for flag, value in TRACE_FLAG_DEFAULTS.items() if getattr(args, flag, value) not in (value, [value])
        ]
        if used:
            raise BadInput(f"--{used[0].replace('_', '-')} shapes a replayed trace: it needs --trace FILE")
        return {}
    for flag, clash in (
        ("--arrivals", getattr(args, "arrivals", None) is not None),
        ("--one-shot", getattr(args, "one_shot", False)),
        ("--shared-prefix", bool(getattr(args, "shared_prefix", None))),
        ("--system-prompt", getattr(args, "system_prompt", None) is not None),
        ("--think-time", getattr(args, "think_time", None) is not None),
        ("--schedule", getattr(args, "schedule", "seed") != "seed"),
        ("--scale-to", getattr(args, "scale_to", None) is not None),
        ("--stagger", bool(getattr(args, "stagger", 0.0))),
    ):
        if clash:
            raise BadInput(f"--trace replays its sessions as the trace has them: {flag} does not apply")
    return dict(
        lockstep=False,
        trace=TraceOptions(
            path=str(args.trace),
            format=args.trace_format,
            block_size=args.trace_block_size,
            start_s=args.trace_start,
            duration_s=args.trace_duration,
            sessions=args.trace_sessions,
            max_context=args.trace_max_context,
            kv_tokens=args.trace_kv_tokens,
            skip_bad=args.trace_skip_bad,
            api=args.trace_api,
            timing=args.trace_timing,
            speed=args.trace_speed if isinstance(args.trace_speed, float) else args.trace_speed[0],
            warm=args.trace_warm,
        ),
    )


def recorded_command(argv: list[str]) -> list[str]:
    """The command line as the recording keeps it: credentials scrubbed."""
    return ["rampwatch", *scrub_argv(argv)]


def schedule_from(args: argparse.Namespace) -> list[int]:
    schedule = parse_schedule(args.schedule)
    if args.scale_to:
        schedule = scale_schedule(schedule, parse_tokens(args.scale_to))
    return schedule


def ramp_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig fields add_ramp_args sets (for a sweep, `sessions` is its first point)."""
    sessions = args.sessions if isinstance(args.sessions, int) else (args.sessions or [1])[0]
    return dict(
        model=args.model,
        sessions=sessions,
        stagger=args.stagger,
        schedule=schedule_from(args),
        output_tokens=args.output_tokens,
        max_tokens=args.max_tokens,  # reasoning models: the cap on all generated (reasoning + answer)
        reasoning=args.reasoning,
        ignore_eos=args.ignore_eos,
        retries=max(0, args.retries),
        request_timeout=args.request_timeout,
        reconnect_timeout=args.reconnect_timeout,
        record_text=args.record_text,
        lockstep=args.lockstep,
        one_shot=args.one_shot,
        strict_needle=args.strict_needle,
        time_limit=args.time_limit,
        grace=args.grace,
        **request_settings(args),
        **prompt_shape_settings(args),
        **worker_settings(args),
    )


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """--workers, --cluster, --workers-per-node, --workers-restart and (run's) --shard and --start-at, checked."""
    workers = parse_workers(args.workers)
    if args.cluster is not None:
        if args.cluster != "ray" and not args.cluster.startswith("ray://"):
            raise BadInput(f"--cluster {args.cluster!r}: ray (a local Ray runtime) or ray://HOST:PORT")
        if args.workers != "1":
            raise BadInput("--cluster places its workers itself (--workers-per-node N on each node): not --workers")
    elif args.workers_per_node != 1:
        raise BadInput("--workers-per-node places workers on a cluster's nodes: it needs --cluster")
    distributed = workers > 1 or args.cluster is not None
    shard = parse_shard(args.shard) if getattr(args, "shard", None) else None
    start_at = parse_start_at(args.start_at) if getattr(args, "start_at", None) else None
    if shard is not None and distributed:
        raise BadInput("--shard is one process's part of a run: not with --workers or --cluster")
    if args.workers_restart and not distributed:
        raise BadInput("--workers-restart replaces a lost worker: it needs --workers N (N > 1) or --cluster")
    return dict(
        workers=workers,
        cluster=args.cluster,
        workers_per_node=args.workers_per_node,
        workers_restart=args.workers_restart,
        shard=shard,
        start_at=start_at,
    )


def prompt_shape_settings(args: argparse.Namespace) -> dict[str, Any]:
    """--system-prompt, --shared-prefix, --corpus and --think-time, checked."""
    check_corpus_path(args.corpus)
    return dict(
        system_prompt=load_system_prompt(args.system_prompt),
        shared_prefix=shared_prefix_size(args.shared_prefix),
        corpus=args.corpus,
        think_time=parse_think_time(args.think_time),
    )


def request_settings(args: argparse.Namespace) -> dict[str, Any]:
    """--extra-body and --header, checked: what every chat request carries besides the conversation."""
    try:
        extra_body = parse_extra_body(args.extra_body) if args.extra_body else {}
    except ValueError as e:
        raise BadInput(f"--extra-body: {e}") from None
    headers = []
    for spec in args.header:
        try:
            headers.append(parse_header(spec))
        except ValueError as e:
            raise BadInput(f"--header {scrub_header_arg(spec)!r}: {e}") from None
    # --reasoning's thinking switches join the body; a user's own chat_template_kwargs keys win over them.
    return dict(extra_body=with_reasoning(extra_body, args.reasoning), request_headers=headers)


def watch_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig fields add_server_watch_args sets: metrics and GPU sources, Prometheus, TLS, the key."""
    gpus = args.gpu or ([] if args.prometheus else ["auto"])  # with --prometheus the GPUs come from it
    if len(gpus) > 1 and any("://" not in g for g in gpus):
        raise BadInput("--gpu auto or none cannot be combined with other --gpu sources")
    for g in gpus:
        if g not in ("auto", "none") and "://" not in g:
            raise BadInput(f"--gpu {g!r}: use auto, none or a dcgm-exporter URL like http://node1:9400/metrics")
    serve_metrics = listen_setting("--serve-metrics", args.serve_metrics)
    if args.prometheus and not is_http_url(args.prometheus):
        raise BadInput(f"not a URL: {args.prometheus!r} (e.g. http://127.0.0.1:8000)")
    matches, gpu_matchers = prometheus_selection(args)
    return dict(
        metrics_urls=args.metrics_url or [],
        gpu=gpus,
        scrape_interval=max(0.05, args.scrape_interval),
        api_key=load_api_key(args.api_key_env, args.api_key_file),
        metrics_token=load_metrics_token(args.metrics_auth_env),
        ca_bundle=args.ca_bundle,
        insecure=args.insecure,
        prometheus=args.prometheus,
        prometheus_match=matches,
        prometheus_gpu_match=gpu_matchers,
        serve_metrics=serve_metrics,
        otlp=listen_setting("--otlp", args.otlp),
    )


def listen_setting(flag: str, listen: str | None) -> str | None:
    """`flag` [HOST:]PORT (--serve-metrics, --otlp), checked before anything starts."""
    if listen:
        try:
            parse_listen(listen)
        except ValueError as e:
            raise BadInput(f"{flag}: {e}") from None
    return listen


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
