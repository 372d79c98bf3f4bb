"""Serving the simulated engine: in the foreground (`rampwatch sim`), or as a
child process on a socket the parent already bound (`rampwatch demo`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from rampwatch.drivers.sim.deployment import apps
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.hosting import serve_all
from rampwatch.drivers.sim.profiles import PROFILES, make_profile
from rampwatch.drivers.sim.router import POLICIES
from rampwatch.drivers.sim.sockets import loopback_socket
from rampwatch.drivers.sim.surfaces import FLAVORS
from rampwatch.drivers.sim.topology import Topology


def _whole_at_least(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number, refused in one line below `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be {least} or more: {text!r}")
        return value

    return parse


def add_sim_args(p: argparse.ArgumentParser, default_profile: str = "tiny") -> None:
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=default_profile,
        help=f"engine profile (default {default_profile})",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        metavar="X",
        help="run the modelled engine X times faster than real time",
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N", help="token budget per step")
    p.add_argument("--kv-tokens", type=int, default=None, metavar="N", help="KV pool size in tokens")
    p.add_argument("--block-size", type=int, default=None, metavar="N", help="KV block size in tokens")
    p.add_argument("--max-model-len", type=int, default=None, metavar="N", help="longest prompt + output accepted")
    p.add_argument(
        "--step-ms",
        type=float,
        default=None,
        metavar="MS",
        help="fixed time of every engine step, in modelled ms (paces the 'fast' profile)",
    )
    p.add_argument(
        "--burst",
        type=_whole_at_least(1),
        default=None,
        metavar="N",
        help="tokens each running request gets a step, written together (the 'fast' profile: 8); for 'fast': "
        "on a calibrated profile it multiplies the modelled decode rate",
    )
    p.add_argument(
        "--flavor",
        choices=FLAVORS,
        default="vllm",
        help="whose HTTP and metrics surface to serve: vllm (default) or sglang (SGLang 0.5's metric names, "
        "/get_model_info, /get_server_info; labelled simulated)",
    )
    p.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="sglang flavour: put cached tokens in usage, as SGLang's --enable-cache-report does",
    )
    p.add_argument(
        "--reasoning-tokens",
        type=_whole_at_least(0),
        default=None,
        metavar="N",
        help="a reasoning model: think N tokens (streamed as reasoning_content, counted in usage's "
        "reasoning_tokens and against max_tokens) before each answer, unless the request's chat_template_kwargs "
        "set enable_thinking or thinking false (default 0)",
    )
    p.add_argument(
        "--enable-per-request-metrics",
        action="store_true",
        help="as vLLM's flag: put the engine's own timing of each request (queue_time_ms, time_to_first_token_ms, "
        "generation_time_ms, mean_itl_ms) in a 'metrics' object beside usage (the demo turns it on)",
    )
    p.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="as vLLM's flag: POST one OTLP/HTTP protobuf 'llm_request' span per request, when it ends, to URL "
        "(e.g. http://127.0.0.1:4318/v1/traces, where rampwatch run --otlp 4318 listens)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="also serve a simulated dcgm-exporter at /dcgm/metrics: N GPUs per engine whose load follows "
        "its steps (labelled simulated)",
    )
    p.add_argument(
        "--node",
        default="sim-node",
        metavar="NAME",
        help="the simulated GPUs' Hostname (replicas and splits add -1, -2 or -prefill, -decode)",
    )

    p.add_argument(
        "--router-policy",
        choices=POLICIES,
        default=None,
        help="with a router topology: how the simulated router picks a replica, as vllm-router's policy option: "
        "consistent_hash (default; keyed on the x-session-id header or the body's session_params.session_id) or "
        "round_robin",
    )
    p.add_argument(
        "--router-restart-after",
        type=_whole_at_least(0),
        default=None,
        metavar="N",
        help="with a router topology: restart the simulated router after it routed N requests (its counters from "
        "zero, its ring rotated by one replica: every session moves); also POST /sim/router/restart",
    )


def check_router_args(args: argparse.Namespace) -> None:
    """ValueError (one line) when a router flag is given without a router to apply it to."""
    if topology_of(args).kind != "router":
        for flag in ("router_policy", "router_restart_after"):
            if getattr(args, flag, None) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} needs a router: --topology router")


def add_fault_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fault knobs (for reliability tests; also settable at run time with POST /sim/faults)")
    g.add_argument(
        "--fail-status", type=int, default=500, metavar="CODE", help="status for --fail-requests (500 or 503)"
    )
    g.add_argument(
        "--fail-requests",
        type=int,
        default=0,
        metavar="N",
        help="answer the next N requests with --fail-status (-1: all)",
    )
    g.add_argument(
        "--drop-after-tokens", type=int, default=0, metavar="N", help="drop the connection after N tokens ..."
    )
    g.add_argument("--drop-requests", type=int, default=0, metavar="N", help="... on the next N streams (-1: all)")
    g.add_argument(
        "--error-after-tokens", type=int, default=0, metavar="N", help="send an error chunk after N tokens ..."
    )
    g.add_argument("--error-requests", type=int, default=0, metavar="N", help="... on the next N streams (-1: all)")
    g.add_argument("--stall", type=float, default=0.0, metavar="S", help="stall S seconds before the first byte ...")
    g.add_argument("--stall-requests", type=int, default=0, metavar="N", help="... of the next N requests (-1: all)")
    g.add_argument(
        "--metrics-fault", choices=("ok", "404", "malformed", "slow"), default="ok", help="how /metrics misbehaves"
    )


def profile_from(args: argparse.Namespace) -> Any:
    step = getattr(args, "step_ms", None)
    return make_profile(
        args.profile,
        time_scale=args.time_scale,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_tokens=args.kv_tokens,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        step_overhead_s=None if step is None else step / 1000,
        burst=getattr(args, "burst", None),
    )


def faults_from(args: argparse.Namespace) -> SimFaults:
    return SimFaults(
        fail_status=args.fail_status,
        fail_requests=args.fail_requests,
        drop_after_tokens=args.drop_after_tokens,
        drop_requests=args.drop_requests,
        error_after_tokens=args.error_after_tokens,
        error_requests=args.error_requests,
        stall_s=args.stall,
        stall_requests=args.stall_requests,
        metrics=args.metrics_fault,
    )


def topology_of(args: argparse.Namespace) -> Topology:
    return Topology.parse(getattr(args, "topology", None) or "single")


def serve(args: argparse.Namespace, socks: list[socket.socket], announce: bool = True) -> None:
    """The topology's servers, one per socket, until Ctrl-C or SIGTERM."""
    profile = profile_from(args)
    topology = topology_of(args)
    key_var = getattr(args, "api_key_env", None)
    key = os.environ.get(key_var) if key_var else None
    tls = tls_files(args)
    urls = ["{}://{}:{}".format("https" if tls else "http", *sock.getsockname()[:2]) for sock in socks]
    gpus = args.gpus or 0
    server = {
        "gpus": gpus,
        "node": args.node,
        "flavor": args.flavor,
        "cache_report": args.enable_cache_report,
        "reasoning_tokens": getattr(args, "reasoning_tokens", None) or 0,
        "per_request_metrics": bool(getattr(args, "enable_per_request_metrics", False)),
        "otlp_traces_endpoint": getattr(args, "otlp_traces_endpoint", None),
    }
    if announce:
        print(
            f"rampwatch sim: SIMULATED engine '{profile.name}' (time scale {profile.time_scale:g}), "
            f"{'SGLang' if args.flavor == 'sglang' else 'vLLM'}'s HTTP and metrics surface",
            flush=True,
        )
        for line in topology.describe(urls, gpus):
            print(f"  {line}", flush=True)
        if server["reasoning_tokens"]:
            print(f"  a reasoning model: {server['reasoning_tokens']} tokens of thinking per answer", flush=True)
        run_args = [*topology.run_args(urls, gpus), *(["--ca-bundle", tls[0]] if tls else [])]
        print(f"  try: rampwatch run {shlex.join(run_args)}   (Ctrl-C to stop)", flush=True)  # pasted into a shell
    router = {
        "policy": getattr(args, "router_policy", None) or "consistent_hash",
        "restart_after": getattr(args, "router_restart_after", None) or None,
    }
    if announce and topology.kind == "router":
        print(f"  router policy {router['policy']}", flush=True)
    hang_up_as_terminate()
    try:
        asyncio.run(serve_all(apps(topology, profile, faults_from(args), key, urls, server, router), socks, tls))
    except KeyboardInterrupt:
        pass


def tls_files(args: argparse.Namespace) -> tuple[str, str] | None:
    """(certificate, key) PEM files to serve https with (--tls-cert, --tls-key), or None: plain HTTP."""
    cert = getattr(args, "tls_cert", None)
    return (cert, args.tls_key) if cert else None


def add_tls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve https with this certificate (and --tls-key); a client trusts it with rampwatch run --ca-bundle PEM",
    )
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert (PEM)")


def hang_up_as_terminate() -> None:
    """SIGHUP (a closed SSH session) stops the servers gracefully, as SIGTERM
    does; a SIGHUP that is ignored (nohup) stays ignored."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, lambda sig, frame: os.kill(os.getpid(), signal.SIGTERM))


def child_argv(args: argparse.Namespace, fds: list[int]) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "rampwatch.drivers.sim",
        "--profile",
        args.profile,
        "--topology",
        getattr(args, "topology", None) or "single",
    ]
    for fd in fds:
        argv += ["--fd", str(fd)]
    for name in (
        "time_scale",
        "max_num_batched_tokens",
        "kv_tokens",
        "block_size",
        "max_model_len",
        "step_ms",
        "burst",
        "gpus",
        "node",
        "flavor",
        "reasoning_tokens",
        "otlp_traces_endpoint",
        "router_policy",
        "router_restart_after",
        "tls_cert",
        "tls_key",
    ):
        v = getattr(args, name, None)
        if v is not None:
            argv += ["--" + name.replace("_", "-"), str(v)]
    for flag in ("enable_cache_report", "enable_per_request_metrics"):
        if getattr(args, flag, False):
            argv.append("--" + flag.replace("_", "-"))
    return argv


class ChildSim:
    """The simulated engine(s) in a child process on free loopback ports, so
    its CPU never stalls the client's token timestamps; killed on exit.
    `urls`: one per server of the topology (`url` is the first).

    The child ends with this process, however this one ends (SIGKILL too): its
    stdin is a pipe whose only writer is this process, and the end of it stops
    the child (see main)."""

    def __init__(self, args: argparse.Namespace):
        self.socks = [loopback_socket() for _ in range(topology_of(args).sockets)]
        self.tls = tls_files(args)
        self.urls = [f"{'https' if self.tls else 'http'}://127.0.0.1:{s.getsockname()[1]}" for s in self.socks]
        self.url = self.urls[0]
        fds = [s.fileno() for s in self.socks]
        self.proc = subprocess.Popen(
            child_argv(args, fds), pass_fds=fds, stdin=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        try:
            self._wait_ready(timeout)
        except BaseException:  # it did not start, or this process is being stopped (Ctrl-C, lifetime.Stopped)
            self.__exit__()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(self.urls)
        verify = ssl.create_default_context(cafile=self.tls[0]) if self.tls else True
        while waiting and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulated engine exited with code {self.proc.returncode}")
            try:
                if httpx.get(waiting[0] + "/health", timeout=1.0, verify=verify).status_code == 200:
                    waiting.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        if waiting:
            raise RuntimeError("simulated engine did not start")

    def __enter__(self) -> ChildSim:
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        for s in self.socks:
            s.close()


def end_with_parent() -> None:
    """In the child: SIGTERM to itself (a clean stop) once its stdin ends,
    which is when the parent process is gone, however it went. (The simulator
    imports only the model, so it cannot use drivers/run/lifetime.py; a pipe
    needs no prctl.)"""

    def watch() -> None:
        while os.read(0, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sim-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rampwatch.drivers.sim", description="the simulated engine (child mode)")
    p.add_argument("--fd", type=int, action="append", required=True, help="listening sockets inherited from the parent")
    p.add_argument("--topology", default="single")
    add_sim_args(p)
    add_fault_args(p)
    add_tls_args(p)
    args = p.parse_args(argv)
    end_with_parent()
    serve(args, [socket.socket(fileno=fd) for fd in args.fd], announce=False)
    return 0
