"""--cluster ray://HOST:PORT: the driver workers as Ray actors, one per node of a real two-node Ray cluster on this
machine (ray start --head, then a second ray start --address with resources of its own): the run and its report
as with local workers; an actor killed mid-run is a worker lost (its turns in flight `worker lost`, the other
sessions finish, exit 1) and leaves no process. Without Ray, --cluster says how to install it, in one line, exit 2.
The actor's buffer (dropping and counting events when the coordinator falls behind, commands in order) is checked
without Ray.

The cluster tests need the rampwatch[ray] extra: they skip loudly without it, and under CI
(RAMPWATCH_REQUIRE_RAY=1, set by .ci/run) fail."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import msgspec
import psutil
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.ray_workers import MISSING, ShardActor
from tests import procs
from tests.conftest import ROOT, Lines, free_port, missing, rampwatch_cmd, report_json, rw, sim_process

# A cluster of its own on loopback, whatever ~/.ray/auth_token an earlier local ray.init() left (Ray then turns on
# token auth for a head, and a second node started without the token cannot join).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


class Cluster(NamedTuple):
    address: str  # ray://127.0.0.1:PORT, its client server
    temp: str  # its --temp-dir
    gcs: int  # its head's port


def _ray_cli() -> str:
    try:
        import ray  # noqa: F401
    except ImportError:
        missing("RAY", "Ray is not installed: pip install -e '.[ray]' (the rampwatch[ray] extra)")
    exe = shutil.which("ray", path=str(Path(sys.executable).parent))
    if exe is None:
        missing("RAY", "Ray's `ray` command is not beside this Python")
    return exe


def _ours(temp: str, port: int) -> list[psutil.Process]:
    """This cluster's processes (named by its temp dir or its GCS port), and everything they started."""
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if temp in cmd or f":{port} " in cmd + " " or f"--gcs-address=127.0.0.1:{port}" in cmd:
            found[p.pid] = p
            with contextlib.suppress(psutil.Error):
                for c in p.children(recursive=True):
                    found[c.pid] = c
    found.pop(os.getpid(), None)
    return list(found.values())


def _stop(temp: str, port: int) -> list[str]:
    """End what is left of this cluster's processes, alone (`ray stop --force` would end every Ray process of this
    user, another suite's too); returns what is still there afterwards."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = _ours(temp, port)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        psutil.wait_procs(left, timeout=10)
    left = []
    for p in _ours(temp, port):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:160])
    return left


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes on this machine, the head's client server on a free port.

    Each node is a `ray start --block` of this test's (procs.Popen: it ends with pytest, SIGKILL included), whose
    end takes its node's processes along; then whatever is left of them is ended by process id."""
    ray = _ray_cli()
    temp = tempfile.mkdtemp(prefix="rw-ray-")  # short: Ray's socket paths live under it
    gcs, client, agent = free_port(), free_port(), free_port()
    env = {**os.environ, **RAY_ENV}
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
    head = [ray, "start", "--head", "--port", str(gcs), "--ray-client-server-port", str(client)]
    # every port its own and free: another suite's Ray, or a Ray started before, is not this one
    head += ["--runtime-env-agent-port", str(agent), "--include-dashboard", "false", "--temp-dir", temp]
    second = [ray, "start", "--address", f"127.0.0.1:{gcs}"]
    nodes: list[subprocess.Popen] = []
    try:
        for argv, resources, extra in ((head, "nodeA", {}), (second, "nodeB", {"RAY_TMPDIR": temp + "/b"})):
            argv = [*argv, *common, "--resources", json.dumps({resources: 1})]
            node = procs.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**env, **extra})
            nodes.append(node)
            out = Lines(node.stdout)
            if out.wait_for("block forever", 120) is None:
                raise AssertionError(f"Ray node {resources} did not start: {''.join(out.lines)[-3000:]}")
        yield Cluster(f"ray://127.0.0.1:{client}", temp, gcs)
    finally:
        for node in reversed(nodes):
            node.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=60)
        left = _stop(temp, gcs)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes left after the test cluster stopped: {left}"


def _events(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()[1:] if line.strip()]


def _actors_left(cluster: Cluster) -> list[str]:
    """The worker actors still running on this cluster (another cluster's are not this test's)."""
    return [cmd for cmd in map(_live_cmdline, _ours(cluster.temp, cluster.gcs)) if "ShardActor" in cmd]


def _live_cmdline(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        if p.status() != psutil.STATUS_ZOMBIE:
            return " ".join(p.cmdline())[:120]
    return ""


def _turns(record: Path) -> list[tuple]:
    """The report's turns, what does not depend on timing: the same seed gives the same, however driven."""
    keys = ("turn", "context_tokens", "new_tokens", "cached_tokens", "output_tokens", "needle", "error")
    return sorted((s["id"], *(t[k] for k in keys)) for s in report_json(record)["sessions"] for t in s["turns"])


@pytest.mark.serial  # two Ray nodes and a run: alone on the machine
def test_a_run_over_two_ray_nodes_is_a_run_with_one_worker_on_each(ray_cluster, tmp_path):
    address = ray_cluster.address
    record, local = tmp_path / "run.jsonl", tmp_path / "local.jsonl"
    ramp = ["--headless", "--gpu", "none", "--sessions", "4", "--schedule", "1k,2k", "--seed", "7"]
    with sim_process("--profile", "fast") as (_, url):
        p = rw("run", url, *ramp, "--cluster", address, "--record", str(record), env=RAY_ENV, timeout=240)
    with sim_process("--profile", "fast") as (_, url):  # a fresh server: the same seed would hit the first's cache
        q = rw("run", url, *ramp, "--workers", "2", "--record", str(local), timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert q.returncode == 0, q.stdout[-3000:] + q.stderr[-3000:]
    header = json.loads(record.read_text().splitlines()[0])
    assert header["workers"] == 2 and header["cluster"] == address
    events = _events(record)
    started = [e for e in events if e["type"] == "WorkerStarted"]
    assert len(started) == 2
    assert len({e["node"] for e in started}) == 2, started  # one per node: the Ray node ids differ
    assert len({e["pid"] for e in started}) == 2
    assert sorted(s for e in started for s in e["sessions"]) == ["s1", "s2", "s3", "s4"]
    done = [e for e in events if e["type"] == "TurnDone"]
    assert sorted((e["session"], e["turn"]) for e in done) == [(f"s{k}", t) for k in range(1, 5) for t in (1, 2)]
    assert all(e["status"] == "ok" for e in done), done
    clocks = [e for e in events if e["type"] == "WorkerClock"]
    assert clocks and all(abs(e["offset_s"]) <= e["uncertainty_s"] + 0.01 for e in clocks), clocks
    assert "run: done" in p.stdout
    assert not [e for e in events if e["type"] == "Notice" and "dropped" in e.get("message", "")]
    # The report is local workers' report: the same turns, sizes, cache hits and needles.
    assert _turns(record) == _turns(local)
    assert [w["worker"] for w in report_json(record)["client_workers"]] == [0, 1]
    assert not _actors_left(ray_cluster)


@pytest.mark.serial  # two Ray nodes and a run: alone on the machine
def test_a_trace_over_two_ray_nodes_is_the_trace_on_local_workers(ray_cluster, tmp_path):
    """--trace with --cluster: the coordinator reads the trace and hands its requests to the actors, the trace's
    sessions alternating nodes by first appearance; the report is that of the same trace on two local workers."""
    from tests.test_trace_workers import grown_trace, trace_run

    trace = grown_trace(tmp_path / "t.jsonl", 4, [300, 600], start_ms=100, gap_ms=400)
    record, local = tmp_path / "run.jsonl", tmp_path / "local.jsonl"
    with sim_process("--profile", "fast") as (_, url):
        args = trace_run(url, trace, "--seed", "7", "--cluster", ray_cluster.address, "--record", str(record))
        p = rw(*args, env=RAY_ENV, timeout=240)
    with sim_process("--profile", "fast") as (_, url):  # a fresh server: the same seed would hit the first's cache
        q = rw(*trace_run(url, trace, "--seed", "7", "--workers", "2", "--record", str(local)), timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert q.returncode == 0, q.stdout[-3000:] + q.stderr[-3000:]
    events = _events(record)
    started = sorted((e["worker"], e["sessions"], e["node"]) for e in events if e["type"] == "WorkerStarted")
    assert [s[:2] for s in started] == [(0, ["zeta", "mid"]), (1, ["alpha", "beta"])]
    assert len({s[2] for s in started}) == 2, started  # one per node
    planned = {e["session"]: e["worker"] for e in events if e["type"] == "SessionPlanned"}
    assert planned == {"zeta": 0, "alpha": 1, "mid": 0, "beta": 1}
    assert _turns(record) == _turns(local) and len(_turns(record)) == 8
    assert not _actors_left(ray_cluster)


@pytest.mark.serial
@pytest.mark.parametrize("restart", [False, True], ids=["lost", "restarted"])
def test_a_killed_ray_actor_is_a_worker_lost_and_the_others_finish(ray_cluster, tmp_path, restart):
    """Without --workers-restart its sessions end; with it a new actor on the same node takes them on from their
    next turn."""
    address = ray_cluster.address
    record = tmp_path / "run.jsonl"
    schedule = "1k,2k,3k,4k,5k"  # each turn 2-3 s long (an engine step of 1 s): killed mid-turn, not between two
    with sim_process("--profile", "fast", "--step-ms", "1000") as (_, url):
        run = procs.Popen(
            [*rampwatch_cmd(), "run", url, "--headless", "--gpu", "none", "--sessions", "4", "--schedule", schedule]
            + ["--cluster", address, "--record", str(record)]
            + (["--workers-restart"] if restart else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, **RAY_ENV},
        )
        try:
            victim = None
            deadline = time.monotonic() + 120
            while victim is None and time.monotonic() < deadline and run.poll() is None:
                time.sleep(0.2)
                if record.exists():
                    events = _events_so_far(record)
                    sent = {(e.get("session"), e.get("turn")) for e in events if e.get("type") == "RequestSent"}
                    sent -= {(e.get("session"), e.get("turn")) for e in events if e.get("type") == "TurnDone"}
                    in_flight = {s for s, _ in sent}
                    victim = next(  # worker 1, once one of its sessions has a turn in flight
                        (
                            e
                            for e in events
                            if e.get("type") == "WorkerStarted" and e["worker"] == 1 and in_flight & set(e["sessions"])
                        ),
                        None,
                    )
            if victim is None:
                out, err = run.communicate(timeout=60)
                seen = [e.get("type") for e in _events_so_far(record)] if record.exists() else None
                raise AssertionError(
                    f"worker 1 never sent a turn ({run.returncode}, {seen}): {out[-2000:]}{err[-2000:]}"
                )
            os.kill(victim["pid"], signal.SIGKILL)
            out, err = run.communicate(timeout=240)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode == 1, out[-3000:] + err[-3000:]
    events = _events(record)
    lost = [e for e in events if e["type"] == "WorkerLost"]
    assert len(lost) == 1 and lost[0]["worker"] == 1, lost
    assert "Ray actor died" in lost[0]["reason"]
    failed = [e for e in events if e["type"] == "TurnDone" and e.get("error") == "worker lost"]
    assert len(failed) == lost[0].get("turns_lost", 0) >= 1  # a session of its was mid-turn
    # Every turn recorded sent has its end. (A turn the actor began in the last moments before it was killed, whose
    # RequestSent it had not yet handed over, is not in the recording at all: it died with the actor.)
    sent = {(e["session"], e["turn"]) for e in events if e["type"] == "RequestSent"}
    assert sent == {(e["session"], e["turn"]) for e in events if e["type"] == "TurnDone"}
    assert {e["session"] for e in failed} <= set(victim["sessions"])
    assert set(lost[0]["sessions"]) == set(victim["sessions"])
    survivors = [s for e in events if e["type"] == "WorkerStarted" and e["worker"] == 0 for s in e["sessions"]]
    last = len(schedule.split(","))
    if restart:  # worker 2, on the lost one's node, took its sessions on: every turn but the lost ones is done
        (again,) = [e for e in events if e["type"] == "WorkerStarted" and e["worker"] == 2]
        assert again["replaces"] == 1 and again["node"] == victim["node"] and lost[0]["resumed_on"] == 2
        survivors += again["sessions"]
    for s in survivors:  # the other worker's sessions (and the replacement's) ran to their last turn
        ok = [e for e in events if e["type"] == "TurnDone" and e["session"] == s and e["status"] == "ok"]
        assert len(ok) == last - sum(e["session"] == s for e in failed), (s, ok[-1:])
    assert "worker 1 lost" in out + err
    assert not psutil.pid_exists(victim["pid"]) or psutil.Process(victim["pid"]).status() == psutil.STATUS_ZOMBIE
    time.sleep(1)  # ray.kill of the other actor is asynchronous
    assert not _actors_left(ray_cluster)


@pytest.mark.serial
def test_an_interrupted_cluster_run_records_its_workers_turns_cancelled(ray_cluster, tmp_path):
    """Ctrl-C: every worker cancels its turns in flight and sends them before its actor is killed. Turns of 4,096
    tokens (seconds each) keep the signal inside one: it comes some 0.3-0.6 s after the sends show in the recording,
    and with 256-token turns (0.25 s) it once fell in the gap between two turns, with nothing in flight to cancel."""
    address = ray_cluster.address
    record = tmp_path / "run.jsonl"
    schedule = ",".join(f"{k}k" for k in range(1, 13))
    with sim_process("--time-scale", "0.25") as (_, url):
        run = procs.Popen(
            [*rampwatch_cmd(), "run", url, "--headless", "--gpu", "none", "--sessions", "4", "--schedule", schedule]
            + ["--output-tokens", "4096", "--ignore-eos", "--cluster", address, "--record", str(record)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, **RAY_ENV},
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and run.poll() is None:
                time.sleep(0.2)
                events = _events_so_far(record) if record.exists() else []
                sent = {e.get("session") for e in events if e.get("type") == "RequestSent"}
                if len(sent) == 4:
                    break
            run.send_signal(signal.SIGINT)
            out, err = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode == 130, out[-3000:] + err[-3000:]
    events = _events(record)
    sent = {(e["session"], e["turn"]) for e in events if e["type"] == "RequestSent"}
    done = {(e["session"], e["turn"]): e for e in events if e["type"] == "TurnDone"}
    assert sent == set(done)  # every turn sent has its end: the ones in flight cancelled, none lost
    assert any(e["status"] == "cancelled" for e in done.values())
    assert not [e for e in events if e["type"] == "WorkerLost"]
    assert "Traceback" not in err, err[-3000:]
    time.sleep(1)
    assert not _actors_left(ray_cluster)


@pytest.mark.serial
def test_a_coordinator_behind_loses_events_counted_never_its_run(ray_cluster, tmp_path):
    """Each actor's buffer shrunk to 100 bytes: every event line is longer, so every one is dropped; the control
    lines still go (the run ends as it should), and the recording counts what each worker dropped."""
    record = tmp_path / "run.jsonl"
    env = {**RAY_ENV, "RAMPWATCH_RAY_BUFFER_BYTES": "100"}
    with sim_process("--profile", "fast") as (_, url):
        p = rw(
            "run", url, "--headless", "--gpu", "none", "--sessions", "4", "--schedule", "1k,2k",
            "--cluster", ray_cluster.address, "--record", str(record), env=env, timeout=240,
        )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    events = _events(record)
    assert not [e for e in events if e["type"] in ("RequestSent", "TurnDone")]  # the workers' events, all dropped
    dropped: dict[str, int] = {}
    for e in (e for e in events if e["type"] == "Notice"):
        m = re.match(r"worker (\d+): (\d+) events dropped so far", e["message"])
        if m:
            dropped[m[1]] = int(m[2])  # the last says the total
    assert set(dropped) == {"0", "1"} and min(dropped.values()) >= 2 * 4, dropped  # 2 sessions x 2 turns, and more
    assert events[-1]["type"] == "RunEnded" and events[-1]["status"] == "done"
    assert not _actors_left(ray_cluster)


def _events_so_far(record: Path) -> list[dict]:
    out = []
    for line in record.read_text().splitlines()[1:]:
        with contextlib.suppress(ValueError):
            e = json.loads(line)
            if isinstance(e, dict):
                out.append(e)
    return out


def test_without_ray_cluster_says_how_to_install_it_in_one_line():
    hide = "import sys; sys.modules['ray'] = None; from rampwatch.tui.cli import main; sys.exit(main())"
    p = procs.run(
        [sys.executable, "-c", hide, "run", "http://127.0.0.1:9", "--headless", "--cluster", "ray", "--no-record"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [f"rampwatch: {MISSING}"], p.stderr


# -- the actor's buffer, without Ray -------------------------------------------------------------------


def _event(i: int) -> bytes:
    return msgspec.json.encode(ev.Mark(t=float(i), note="x" * 40))


def test_an_actor_drops_events_past_its_cap_counts_them_and_keeps_control_lines():
    actor = ShardActor(3, "node", cap_bytes=1000)
    lines = [_event(i) for i in range(100)]
    for line in lines:
        actor._write(line)
    pong = ww.encode(ww.Pong(n=1, clock=1.0))
    actor._write(pong)  # the buffer is full: a control line is kept all the same
    blob, finished, error = actor.take(0)
    got = blob.split(b"\n")
    kept = sum(1 for line in got if line in lines)
    assert 0 < kept < 100 and got[-1] == pong
    assert actor._dropped == 100 - kept
    notice = msgspec.json.decode(got[0], type=ev.AnyEvent)
    assert isinstance(notice, ev.Notice) and f"{100 - kept} events dropped" in notice.message
    assert "worker 3" in notice.message
    assert (finished, error) == (False, "")
    actor._write(_event(1))  # room again once taken
    blob, _, _ = actor.take(0)
    assert blob == _event(1)
    actor._write(b"x" * 2000)  # dropped, and soon after the last notice: said only with the worker's WorkerDone
    assert actor.take(0)[0] == b""
    done = ww.encode(ww.WorkerDone(failed=False))
    actor._write(done)
    first, last = actor.take(0)[0].split(b"\n")
    assert f"{101 - kept} events dropped" in msgspec.json.decode(first, type=ev.AnyEvent).message and last == done


def test_an_actor_handles_commands_in_their_order_whatever_order_they_come_in():
    actor = ShardActor(0, "node")
    handled: list[bytes] = []
    actor._pending = None  # as if its driver's loop ran: commands go to it

    class Loop:
        def call_soon_threadsafe(self, f, line):  # noqa: ANN001
            handled.append(line)

    actor._loop = Loop()  # type: ignore[assignment]
    actor._next = 1  # WorkerStart (0) came
    actor.command(3, b"c")
    actor.command(2, b"b")
    assert handled == []
    actor.command(1, b"a")
    assert handled == [b"a", b"b", b"c"]


def test_a_ray_client_connection_its_proxy_aborted_is_tried_again(monkeypatch):
    """Ray Client's proxy now and then fails to start a client's server: connect tries again (a stand-in Ray)."""
    import types

    from rampwatch.drivers.run import ray_workers
    from rampwatch.drivers.run.config import RunConfig

    tries: list[str] = []

    def init(address=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        tries.append(address)
        if len(tries) < 3:
            raise ConnectionAbortedError("Initialization failure from server: Starting Ray client server failed")

    node = {"NodeID": "ab" * 28, "Alive": True, "NodeName": "h", "Resources": {"node:__internal_head__": 1}}
    fake = types.SimpleNamespace(
        init=init, shutdown=lambda: None, is_initialized=lambda: True, nodes=lambda: [node], remote=lambda c: c
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_workers.time, "sleep", lambda s: None)
    cluster = ray_workers.RayCluster(RunConfig(url="http://x", cluster="ray://h:10001", workers_per_node=2))
    assert cluster.connect() == 2
    assert tries == ["ray://h:10001"] * 3
    assert cluster.placement(1) == ("ab" * 28, "h/" + "ab" * 6)
