#!/usr/bin/env python3
"""Client overhead benchmark: prints figures, asserts nothing.

Against the simulated engine's 'fast' profile (a child process that streams
as fast as it can), in one run:

  1. bare      a plain httpx streaming loop that only counts chunks
  2. headless  rampwatch's driver in one process (32 sessions, recording on,
               metrics scraped, the RunState folded as it goes)
  3. driver    the driver process that runs behind the UI (recording on,
               streaming its events to a pipe), read by a consumer that folds
               them as the UI does; its CPU is the driver process's alone
  4. the same headless and driver runs against the engine paced to one step
     every --step-ms, to compare the decode tokens/s each measures

and prints, per phase, client CPU per streamed chunk and chunks/s.
Bars: driver CPU/chunk <= 1.5x bare (issue 8: unchanged by moving the
driver into its own process); >= 10,000 chunks/s across 32 sessions.
What the UI itself costs is tests/bench_ui.py's job (a real terminal).

With --workers 1,2 it runs instead the headless driver on each number of worker processes (issue 36), and
prints chunks/s (over the whole run, and from the first request sent to the run's end: the streaming without a
worker's start), CPU per chunk (the coordinator's and its workers' together), failed turns, the turns marked
client busy by a worker's own work and the recording's size; bars: 2 workers >= 1.6x the chunks/s of 1 with the
client the bottleneck, and at 512 sessions 0 failed turns and none busy by a worker's own work. Its engine
writes --burst tokens a request each step (2048), so that its CPU per chunk stays well under the client's on the
cores they share, and is paced only with --step-ms; with --tls it serves https (a self-signed certificate the run
trusts).

usage: python tests/bench_client.py [--sessions 32] [--tokens 2000] [--turns 2] [--workers 1,2 [--burst N] [--tls]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def bare(url: str, sessions: int, tokens: int, turns: int) -> dict:
    import httpx

    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "x " * 500}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chunks = 0
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:

        async def one() -> None:
            nonlocal chunks
            for _ in range(turns):
                async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data:") and line[5:].strip() != "[DONE]":
                            data = json.loads(line[5:])
                            if data.get("choices") and (data["choices"][0].get("delta") or {}).get("content"):
                                chunks += 1

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(sessions)))
        return {"cpu": time.process_time() - cpu0, "wall": time.perf_counter() - t0, "chunks": chunks}


def rampwatch(
    url: str, sessions: int, tokens: int, turns: int, process: bool, workers: int = 1, ca_bundle: str | None = None
) -> dict:
    """The driver headless in this process, or (`process`) in the driver
    process behind the UI; CPU is the driver's alone either way. `ca_bundle`: an https engine's certificate."""
    import resource

    import psutil

    from rampwatch.drivers.model.analysis import build_report
    from rampwatch.drivers.run import event_loop
    from rampwatch.drivers.run.config import RunConfig
    from rampwatch.drivers.run.process import DriverProcess
    from rampwatch.drivers.run.runner import Run

    folder = tempfile.TemporaryDirectory()  # removed once measured (recording_bytes)
    record = Path(folder.name) / "bench.jsonl"
    schedule = [2000 * (k + 1) for k in range(turns)]
    cfg = RunConfig(
        url=url,
        metrics_urls=[url + "/metrics"],
        gpu="none",
        sessions=sessions,
        schedule=schedule,
        output_tokens=tokens,
        ignore_eos=True,
        record=record,
        workers=workers,
        ca_bundle=Path(ca_bundle) if ca_bundle else None,
    )
    if process:
        driver = DriverProcess(cfg)
        t0 = time.perf_counter()
        driver.start()

        async def follow() -> None:
            driver.attach(asyncio.get_running_loop())
            while not driver.finished:
                await asyncio.sleep(0.1)

        asyncio.run(follow())
        driver.stop()
        wall = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the driver process (the engine is not our child)
        cpu, state = usage.ru_utime + usage.ru_stime, driver.state
    else:
        run = Run(cfg)
        cpu0, t0 = time.process_time(), time.perf_counter()

        async def main() -> None:
            await run.prepare()
            await run.drive()

        event_loop.run(main())  # the driver's own loop, as `rampwatch run --headless` drives on
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        coordinator = cpu
        for worker in psutil.Process().children():  # reaped, each counts below (one killed at the end may not be yet)
            worker.wait(timeout=30)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # its workers, if any (the engine is not our child)
        cpu += usage.ru_utime + usage.ru_stime
        assert run.state is not None
        state = run.state
    rep = build_report(state)
    rates = [t.decode_tok_s for s in rep.sessions for t in s.turns if t.decode_tok_s]
    chunks = sum(r.chunks for r in state.turns)
    return {
        "cpu": cpu,
        "wall": wall,
        # First request sent to the run's end: the streaming and the coordinator's catching up with what the
        # workers sent, without the start (a worker's imports and handshake).
        "streaming_s": state.ended.t - min(r.sent_t for r in state.turns) if state.turns and state.ended else None,
        "chunks": chunks,
        "decode_tok_s_median": statistics.median(rates) if rates else None,
        "failed": sum(r.status != "ok" for r in state.turns),
        "busy_own": sum(r.client_busy_own for r in state.turns),
        "cpu_coordinator": None if process else coordinator,
        "recording_bytes": recording_bytes(folder, record),
    }


def recording_bytes(folder: tempfile.TemporaryDirectory, record: Path) -> int:
    """The recording's size; then its folder goes (a fast run records ~100 MB)."""
    try:
        return record.stat().st_size
    finally:
        folder.cleanup()


def phase_main(args: argparse.Namespace) -> None:
    if args.phase == "bare":
        out = asyncio.run(bare(args.url, args.sessions, args.tokens, args.turns))
    else:
        process = args.phase == "driver"
        out = rampwatch(
            args.url, args.sessions, args.tokens, args.turns, process, workers=args.phase_workers, ca_bundle=args.ca
        )
    print(json.dumps(out))


def run_phase(phase: str, url: str, args: argparse.Namespace, workers: int = 1) -> dict:
    cmd = [
        sys.executable,
        __file__,
        *("--phase-workers", str(workers)),
        "--phase",
        phase,
        "--url",
        url,
        "--sessions",
        str(args.sessions),
        "--tokens",
        str(args.tokens),
        "--turns",
        str(args.turns),
        *(("--ca", args.ca) if args.ca else ()),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def build_time() -> float:
    """Seconds to build a 1M-token first turn's request body (filler, needle, JSON)."""
    from rampwatch.drivers.client.chat import chat_body, encode_message
    from rampwatch.drivers.client.ramp import Conversation

    conv = Conversation("bench", [1_000_000])
    t = time.perf_counter()
    chars, _ = conv.plan(1)
    body = chat_body("m", [encode_message("user", list(conv.user_message(1, chars)))], 128, True)
    dt = time.perf_counter() - t
    assert sum(map(len, body)) > 3_900_000
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=2000, help="output tokens per request")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument(
        "--step-ms",
        type=float,
        help="engine step time of the paced phases (default 10); with --workers, pace the engine (default: not)",
    )
    ap.add_argument("--phase", choices=("bare", "headless", "driver"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--phase-workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--ca", help=argparse.SUPPRESS)
    ap.add_argument("--workers", help="compare the headless driver on these numbers of worker processes, e.g. 1,2")
    ap.add_argument(
        "--burst",
        type=int,
        default=2048,
        help="with --workers: tokens the engine writes a request each step (default 2048: its CPU per chunk well "
        "under the client's, so the client is the bottleneck on the cores they share)",
    )
    ap.add_argument(
        "--tls",
        action="store_true",
        help="with --workers: the engine serves https (a self-signed certificate, made with openssl), which the "
        "run trusts with --ca-bundle",
    )
    args = ap.parse_args()
    if args.phase:
        return phase_main(args)

    from rampwatch.drivers.sim.serve import ChildSim

    def sim(step_ms: float | None, burst: int | None = None, tls: tuple[str, str] | None = None) -> ChildSim:
        cert, key = tls or (None, None)
        return ChildSim(argparse.Namespace(profile="fast", step_ms=step_ms, burst=burst, tls_cert=cert, tls_key=key))

    if args.tls and not args.workers:
        ap.error("--tls goes with --workers")
    if args.workers:
        tls = None
        if args.tls:
            sys.path.insert(0, str(ROOT))
            from tests.certs import self_signed

            tls = self_signed(Path(tempfile.mkdtemp()))
        args.ca = tls[0] if tls else None
        return compare_workers([int(n) for n in args.workers.split(",")], args, sim(args.step_ms, args.burst, tls))

    print(f"1M-token turn body built in {build_time() * 1000:.0f} ms")
    results = {}
    with sim(None) as fast:  # as fast as the engine process can go: client CPU and throughput
        results["bare"] = run_phase("bare", fast.url, args)
        results["headless"] = run_phase("headless", fast.url, args)
        results["driver"] = run_phase("driver", fast.url, args)
    args.step_ms = args.step_ms or 10.0
    with sim(args.step_ms) as paced:  # a paced engine: do both measure the same decode rate?
        results["headless, paced"] = run_phase("headless", paced.url, args)
        results["driver, paced"] = run_phase("driver", paced.url, args)
    print(
        f"\n{args.sessions} sessions x {args.turns} turns x {args.tokens} tokens from the simulated 'fast' engine "
        f"(8 tokens a step; paced: one step every {args.step_ms:g} ms)\n"
    )
    print(f"{'phase':<16}{'chunks':>9}{'chunks/s':>11}{'CPU µs/chunk':>14}{'decode tok/s (median)':>24}")
    for phase, r in results.items():
        per = r["cpu"] / r["chunks"] * 1e6 if r["chunks"] else float("nan")
        dec = r.get("decode_tok_s_median")
        print(
            f"{phase:<16}{r['chunks']:>9}{r['chunks'] / r['wall']:>11,.0f}{per:>14.1f}"
            f"{(f'{dec:,.0f}' if dec else '-'):>24}"
        )
    b, h, d, hp, dp = (results[k] for k in ("bare", "headless", "driver", "headless, paced", "driver, paced"))

    def per_chunk(r: dict) -> float:
        return r["cpu"] / r["chunks"]

    print(
        "\nheadless driver (recording on) CPU per chunk vs bare httpx "
        f"loop: {per_chunk(h) / per_chunk(b):.2f}x  (bar <= 1.5)"
    )
    print(
        "driver process behind the UI, CPU per chunk vs bare httpx "
        f"loop: {per_chunk(d) / per_chunk(b):.2f}x  (bar <= 1.5)"
    )
    print(f"rampwatch headless throughput: {h['chunks'] / h['wall']:,.0f} chunks/s  (bar >= 10,000)")
    if hp["decode_tok_s_median"] and dp["decode_tok_s_median"]:
        diff = dp["decode_tok_s_median"] / hp["decode_tok_s_median"] - 1
        print(f"decode tok/s measured by the driver process vs headless (paced): {diff * 100:+.1f}%  (bar within ±5%)")
    print(
        f"failed turns: {sum(r.get('failed', 0) for r in results.values())}; "
        f"recording {h['recording_bytes'] / 1e6:.1f} MB"
    )


def compare_workers(counts: list[int], args: argparse.Namespace, engine) -> None:  # noqa: ANN001
    """The headless driver on each number of workers against one fast engine: chunks/s, CPU per chunk."""
    import psutil

    results = {}
    with engine as fast:
        sim = psutil.Process(fast.proc.pid)
        for n in counts:
            before = sum(sim.cpu_times()[:2])
            results[n] = run_phase("headless", fast.url, args, workers=n)
            results[n]["cpu_engine"] = sum(sim.cpu_times()[:2]) - before  # what the engine took of the same cores
    paced = f", one step every {args.step_ms:g} ms" if args.step_ms else ""
    paced += ", over TLS" if args.ca else ""
    print(
        f"\n{args.sessions} sessions x {args.turns} turns x {args.tokens} tokens from the simulated 'fast' engine "
        f"({args.burst} tokens a request a step{paced}), headless, recording on\n"
    )
    head = f"{'workers':<9}{'chunks':>9}{'chunks/s':>11}{'streaming':>11}{'CPU µs/chunk':>14}{'coordinator':>13}"
    print(head + f"{'failed':>8}{'busy (own)':>12}{'engine µs/chunk':>17}{'cores busy':>12}{'recording MB':>14}")
    for n, r in results.items():
        per = r["cpu"] / r["chunks"] * 1e6 if r["chunks"] else float("nan")
        mine = r["cpu_coordinator"] / r["chunks"] * 1e6 if r["chunks"] else float("nan")  # of that, its own
        row = f"{n:<9}{r['chunks']:>9}{r['chunks'] / r['wall']:>11,.0f}{_streaming_rate(r):>11,.0f}"
        row += f"{per:>14.2f}{mine:>13.2f}"
        engine = r["cpu_engine"] / r["chunks"] * 1e6 if r["chunks"] else float("nan")
        cores = (r["cpu"] + r["cpu_engine"]) / r["wall"]  # the client's and the engine's CPU over the run's wall time
        row += f"{r['failed']:>8}{r['busy_own']:>12}{engine:>17.2f}{cores:>12.2f}"
        print(row + f"{r['recording_bytes'] / 1e6:>14.1f}")
    print("(chunks/s: over the whole run, its start included; streaming: first request sent to the run's end)")
    base = results[counts[0]]
    for n in counts[1:]:
        r = results[n]
        whole = (r["chunks"] / r["wall"]) / (base["chunks"] / base["wall"])
        streaming = _streaming_rate(r) / _streaming_rate(base)
        print(
            f"{n} workers vs {counts[0]}: {whole:.2f}x the chunks/s, {streaming:.2f}x while streaming "
            "(bar >= 1.6x with the client the bottleneck)"
        )
    print(f"cores on this machine: {os.cpu_count()} (the engine, the coordinator and the workers share them)")


def _streaming_rate(r: dict) -> float:
    return r["chunks"] / r["streaming_s"] if r["streaming_s"] else float("nan")


if __name__ == "__main__":
    main()
