"""Beyond one server: replicas and a prefill/decode split, each endpoint its
own view (issue 11), against the simulated topologies run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import read_recording
from rampwatch.drivers.sim.faults import SimFaults
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.tui.app import RampwatchApp
from rampwatch.tui.sources import ReplaySource
from tests import procs
from tests.conftest import drive, rampwatch_cmd
from tests.simhost import ThreadedSim

ROOT = Path(__file__).resolve().parents[1]
REPLICAS_SAMPLE = ROOT / "recordings" / "sim-replicas-2x4x32k.sample.jsonl"
# The servers' counts that add up to servers_total.
COUNTS = (
    "prompt_tokens prompt_computed_tokens prefix_query_tokens prefix_hit_tokens generation_tokens preemptions "
    "prefill_tok_s decode_tok_s kv_capacity_tokens"
).split()


def demo(tmp_path: Path, topology: str, sessions: int) -> tuple[dict, list]:
    rec = tmp_path / f"{topology.replace(':', '-')}.jsonl"
    flags = (
        f"--topology {topology} --profile tiny --time-scale 1 --scale-to 16k --sessions {sessions} --output-tokens 32"
    )
    argv = [*rampwatch_cmd(), "demo", *flags.split(), "--headless", "--record", str(rec)]
    p = procs.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = procs.run([*rampwatch_cmd(), "report", str(rec), "--format", "json"], capture_output=True, text=True)
    return json.loads(out.stdout), read_recording(rec).events


def assert_total_is_the_sum(rep: dict) -> None:
    total = rep["servers_total"]
    for key in COUNTS:
        values = [s[key] for s in rep["servers"] if s[key] is not None]
        assert total[key] == pytest.approx(sum(values)), key


def test_demo_on_two_replicas_spreads_sessions_and_reports_each_server(tmp_path):
    rep, events = demo(tmp_path, "replicas:2", sessions=4)
    assert [s["summary"]["reached_turn"] for s in rep["sessions"]] == [10] * 4
    servers = rep["servers"]
    assert len(servers) == 2 and {s["role"] for s in servers} == {"both"}
    planned = [e for e in events if isinstance(e, ev.SessionPlanned)]
    # Round-robin: s1 and s3 on the first replica, s2 and s4 on the second.
    assert [e.endpoint for e in planned] == [servers[0]["name"], servers[1]["name"]] * 2 or [
        e.endpoint for e in planned
    ] == [servers[1]["name"], servers[0]["name"]] * 2
    # Every token generated was counted by exactly one replica, evenly (two sessions each).
    turns = [t for s in rep["sessions"] for t in s["turns"]]
    assert rep["servers_total"]["generation_tokens"] == sum(t["output_tokens"] for t in turns)
    assert servers[0]["generation_tokens"] == servers[1]["generation_tokens"]
    assert_total_is_the_sum(rep)
    assert [r["name"] for r in rep["roles"]] == ["both"]


@pytest.mark.serial  # the run's last scrape must land before its end: 90% of the transfer attributed
def test_demo_on_a_prefill_decode_split_reports_each_role(tmp_path):
    rep, events = demo(tmp_path, "pd", sessions=2)
    assert [s["summary"]["reached_turn"] for s in rep["sessions"]] == [10, 10]
    by_role = {s["role"]: s for s in rep["servers"]}
    assert set(by_role) == {"prefill", "decode"}
    pre, dec = by_role["prefill"], by_role["decode"]
    turns = [t for s in rep["sessions"] for t in s["turns"]]
    # The prefill node computed the prompts and generated one token each; the decode node streamed every reply,
    # its own prefix cache holding the earlier turns and each turn's new KV brought over (not counted as hits).
    assert pre["generation_tokens"] == len(turns)
    assert dec["generation_tokens"] == sum(t["output_tokens"] for t in turns)
    assert pre["prompt_computed_tokens"] > 50 * dec["prompt_computed_tokens"]
    assert 0 < dec["prefix_hit_tokens"] < dec["prefix_query_tokens"] - dec["prompt_computed_tokens"]
    # What the decode node did not compute was reused from its prefix cache or transferred: never both counted.
    assert all(t["cached_tokens"] + t["transferred_tokens"] >= 0.9 * t["context_tokens"] for t in turns)
    # The demo scrapes every 0.5 s and these turns last ~0.1 s: one scrape window holds both sessions' turns 1
    # and 2, and what the decode server could not have held in its prefix cache (all of a turn 1) is transferred.
    assert all(t["cached_tokens"] == 0 for t in turns if t["turn"] == 1)
    # Never more than the server moved; less only by a turn no later sample covered (on a loaded machine the run's
    # last scrape can be cut short: that turn stays unattributed rather than guessed; CI saw 93% once).
    attributed = sum(t["transferred_tokens"] for t in turns)
    assert 0.9 * dec["transferred_tokens"] <= attributed <= dec["transferred_tokens"]
    assert {r["name"]: r["decode_tok_s"] for r in rep["roles"]} == {
        "prefill": pre["decode_tok_s"],
        "decode": dec["decode_tok_s"],
    }
    assert_total_is_the_sum(rep)
    header = read_recording(next(tmp_path.glob("*.jsonl"))).header
    assert [(e.name, e.role, bool(e.url), bool(e.metrics)) for e in header.endpoints] == [
        (header.endpoints[0].name, "both", True, False),
        ("prefill", "prefill", False, True),
        ("decode", "decode", False, True),
    ]


def test_pin_sends_a_session_to_the_server_named(tmp_path):
    with ThreadedSim(make_profile("tiny")) as a, ThreadedSim(make_profile("tiny")) as b:
        run = drive(
            a.url,
            more_urls=[b.url],
            sessions=3,
            pins={"s1": b.url},
            schedule=[2000, 4000],
            output_tokens=8,
            metrics_urls=[],
        )
        assert run.exit_code == 0
        where = {s.id: s.endpoint for s in run.state.sessions.values()}
        name_a, name_b = (u.removeprefix("http://") for u in (a.url, b.url))
        assert where == {"s1": name_b, "s2": name_b, "s3": name_a}  # s2 and s3 round-robin from the second server
        assert set(run.state.endpoints) == {name_a, name_b}


@pytest.mark.parametrize(
    "args, says",
    [
        (["http://127.0.0.1:9", "http://127.0.0.1:9"], "the same server URL is given twice"),
        (["http://127.0.0.1:9", "--pin", "s7=http://127.0.0.1:9"], "no such session"),
        (["http://127.0.0.1:9", "--pin", "s1=http://10.9.9.9:1"], "not one of the servers"),
        (["http://127.0.0.1:9", "--pin", "s1"], "use SESSION=URL"),
        (["http://127.0.0.1:9", "--metrics-url", "prefill:p0=nowhere"], "not a URL"),
        (["http://127.0.0.1:9", "--metrics-url", "http://127.0.0.1:99999/metrics"], "not a URL"),
        (["http://127.0.0.1:9", "--metrics-url", "ftp://127.0.0.1/metrics"], "not a URL"),
        (
            ["http://127.0.0.1:9", "--metrics-url", "a=http://x:1/metrics", "--metrics-url", "a=http://y:1/metrics"],
            "same name",
        ),
    ],
)
def test_bad_topologies_are_one_line_and_exit_2(args, says, tmp_path):
    p = procs.run(
        [*rampwatch_cmd(), "run", *args, "--headless", "--no-record"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_failing_endpoint_is_its_own_row(tmp_path):
    """One replica's /metrics breaks: its row says so, the other and the run go on."""
    with (
        ThreadedSim(make_profile("tiny")) as a,
        ThreadedSim(make_profile("tiny"), faults=SimFaults(metrics="404")) as b,
    ):
        run = drive(a.url, more_urls=[b.url], sessions=2, schedule=[2000, 4000], output_tokens=8, metrics_urls=[])
    assert run.exit_code == 0
    name_a, name_b = (u.removeprefix("http://") for u in (a.url, b.url))
    assert (
        run.state.endpoints[name_b].error.startswith("HTTP 404") and run.state.endpoints[name_b].last_sample_t is None
    )
    assert (
        run.state.endpoints[name_a].error is None and run.state.server.values["generation_tokens"] == 16
    )  # s1 on a: 2 turns x 8


def _replicas_app() -> RampwatchApp:
    if not REPLICAS_SAMPLE.exists():
        pytest.fail(f"shipped recording missing: {REPLICAS_SAMPLE}")
    src = ReplaySource(read_recording(REPLICAS_SAMPLE))
    src.seek(src.turn_marks[len(src.turn_marks) * 2 // 3] + 0.3)
    src.paused = True
    return RampwatchApp(src, autostart=False)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_per_endpoint_rows_snapshot(snap_compare, size):
    assert snap_compare(_replicas_app(), terminal_size=size)
