"""Behind a real router (issue 37): two real vLLM CPU replicas, each naming itself in its spans' resource
(OTEL_RESOURCE_ATTRIBUTES=service.instance.id=r0 / r1), behind the vLLM project's own `vllm-router`
(.ci/setup_vllm.sh installs it into the vLLM venv), driven by `rampwatch run` as a user runs it."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from tests import procs
from tests.conftest import VLLM_VENV, free_port, missing, run_against_real_server, stop_group, vllms, wait_up

pytestmark = pytest.mark.vllm

ROUTER = VLLM_VENV / "bin" / "vllm-router"
OTEL = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
SCHEDULE = ("--schedule", "1k,2k,3k,4k", "--output-tokens", "8", "--ignore-eos")


@pytest.fixture(scope="module")
def replicas(tiny_model, tmp_path_factory):
    """(the two replicas' URLs, the port their spans go to): r0 and r1, both sending spans to one port."""
    if not ROUTER.exists():
        missing("VLLM", f"no vllm-router at {ROUTER}: run .ci/setup_vllm.sh")
    otlp = free_port()
    flags = ("--enable-per-request-metrics", "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp}/v1/traces")
    names = [{"OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id=r{k}"} for k in range(2)]
    with vllms(tiny_model, tmp_path_factory.mktemp("replicas"), flags, flags, env=OTEL, envs=names) as urls:
        yield urls, otlp


@contextlib.contextmanager
def router(urls: list[str], policy: str, logs: Path):
    """`vllm-router` in front of `urls` with `policy`; yields (its URL, its Prometheus metrics URL)."""
    port, metrics = free_port(), free_port()
    log = logs / f"router-{policy}.log"
    with open(log, "w") as out:
        cmd = [str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls, "--policy", policy]
        proc = procs.Popen(
            [*cmd, "--prometheus-port", str(metrics)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(proc, url, "vllm-router", log, 120)
        yield url, f"http://127.0.0.1:{metrics}/metrics"
    finally:
        stop_group(proc)


def behind(policy: str, replicas, tmp_path: Path, *extra: str, spans: bool = True) -> dict:
    """A run of 4 sessions behind `policy`, each with its session header, every server scraped; its report."""
    urls, otlp = replicas
    with router(urls, policy, tmp_path) as (url, router_metrics):
        scrape = ["--metrics-url", f"router:router={router_metrics}"]
        scrape += [a for k, u in enumerate(urls) for a in ("--metrics-url", f"r{k}={u}/metrics")]
        args = [*scrape, "--header", "x-session-id: {session}", *SCHEDULE, *extra]
        args += ["--otlp", str(otlp)] if spans else []
        return run_against_real_server(url, *args, record=tmp_path / f"{policy}.jsonl")


def test_consistent_hash_keeps_each_session_on_its_replica_named_by_its_spans(replicas, tmp_path):
    rep = behind("consistent_hash", replicas, tmp_path, "--sessions", "4")
    for s in rep["sessions"]:
        turns = s["turns"]
        assert len(turns) == 4 and not any(t["error"] for t in turns), turns
        assert all(t["served_by_source"] == "span" for t in turns), turns
        assert len({t["served_by"] for t in turns}) == 1 and turns[0]["served_by"] in ("r0", "r1"), turns
        assert s["affinity"]["share"] == 1.0 and s["affinity"]["moves"] == []
        # On one replica the prefix cache holds the session's history, as a single server's does: turn N reuses
        # turn N-1's prompt (1K of 2K, 2K of 3K, 3K of 4K), to vLLM's 16-token blocks.
        assert all(t["hit_rate"] > 0.4 for t in turns[1:]), turns
    assert rep["affinity"]["share"] == 1.0 and rep["affinity"]["served_turns"] == 16
    r = next(f for f in rep["servers"] if f["role"] == "router")
    assert sum(r["workers"].values()) >= 16, r  # vllm-router's own count of what it sent each worker


def test_round_robin_moves_sessions_and_the_report_says_which_turns(replicas, tmp_path):
    """Round robin rotates over every request the router forwards, rampwatch's own /tokenize calls among them (a
    turn counts its text with the server before it is sent): where a lone session's turns land depends on how many
    of those each turn makes. Four sessions interleave, so some turns move; each turn that moved finds less of its
    history than on its own replica."""
    (tmp_path / "hash").mkdir()
    hashed = behind("consistent_hash", replicas, tmp_path / "hash", "--sessions", "1")
    stayed = {t["turn"]: t["hit_rate"] for t in hashed["sessions"][0]["turns"]}
    rep = behind("round_robin", replicas, tmp_path, "--sessions", "4")
    moves = 0
    for s in rep["sessions"]:
        turns = s["turns"]
        assert all(t["served_by_source"] == "span" and t["served_by"] in ("r0", "r1") for t in turns), turns
        moved = {m["turn"]: m for m in s["affinity"]["moves"]}
        moves += len(moved)
        for t in turns[1:]:
            if t["turn"] in moved:  # the report names it, from and to, with the hit rates around it
                m = moved[t["turn"]]
                assert (m["to_backend"], m["hit_after"]) == (t["served_by"], t["hit_rate"]), (m, t)
                assert t["hit_rate"] < stayed[t["turn"]] - 0.05, (t, stayed)
    assert moves > 0 and rep["affinity"]["moves"] == moves and rep["affinity"]["share"] < 1.0, rep["affinity"]


def test_without_spans_the_counters_name_the_replica_of_turns_apart_and_call_overlapping_ones_ambiguous(
    replicas, tmp_path
):
    """No --otlp: the replicas' own counters tell which one moved by a turn's prompt. One session pausing a second
    between turns: every turn told, all on its one replica. Two sessions in lockstep: on two replicas each turn
    overlaps the other's and both moved by the same prompt size (ambiguous, never guessed); on one, the lone mover
    served both."""
    (tmp_path / "one").mkdir()
    paced = ("--scrape-interval", "0.1", "--think-time", "1s")
    one = behind("consistent_hash", replicas, tmp_path / "one", "--sessions", "1", *paced, spans=False)
    (s,) = one["sessions"]
    assert [t["served_by_source"] for t in s["turns"]] == ["counters"] * 4, s["turns"]
    assert len({t["served_by"] for t in s["turns"]}) == 1 and s["turns"][0]["served_by"] in ("r0", "r1")
    two = behind("consistent_hash", replicas, tmp_path, "--sessions", "2", "--lockstep", *paced, spans=False)
    sources = [t["served_by_source"] for x in two["sessions"] for t in x["turns"]]
    assert set(sources) <= {"counters", "ambiguous"} and len(sources) == 8, sources
    # Whether a lockstep pair's turns overlap on the counters' samples is timing (all named, all ambiguous, or each
    # way for some turns, as CI saw once); what is named is never a guess: one replica per session (consistent_hash).
    for x in two["sessions"]:
        named = {t["served_by"] for t in x["turns"] if t["served_by_source"] == "counters"}
        assert len(named) <= 1 and named <= {"r0", "r1"}, x["turns"]
    print(f"counters named {sources.count('counters')} of {len(sources)} lockstep turns; the rest ambiguous")
