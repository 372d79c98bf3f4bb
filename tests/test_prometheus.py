"""Many nodes through Prometheus (issue 12): GPUs labelled by node, the fleet
read from a real Prometheus server, rampwatch's own figures exported to it and
read back, and the Grafana dashboard's queries."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model import panels
from rampwatch.drivers.model.analysis import build_report
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.recording import Recording, read_recording
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.gpus import DCGM_PATH
from rampwatch.drivers.sim.profiles import make_profile
from rampwatch.drivers.telemetry.client_metrics import SERIES, ClientMetrics
from rampwatch.drivers.telemetry.gpu import parse_dcgm
from rampwatch.drivers.telemetry.metrics import ENGINE_POOL, SAMPLE_LINE, normalize, parse_labels
from rampwatch.drivers.telemetry.prometheus import ENGINE_SERIES, Match, PrometheusReader, parse_match
from rampwatch.tui.app import RampwatchApp
from rampwatch.tui.sources import ReplaySource
from tests import procs
from tests.conftest import DATA, free_port, missing, rampwatch_cmd
from tests.simhost import ThreadedSim

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = [2000, 4000, 8000]


def ramp(urls: list[str], exporter: ClientMetrics | None = None, **cfg) -> Run:
    """A two-session ramp in this process, over `urls`, feeding `exporter`."""
    config = RunConfig(
        url=urls[0],
        more_urls=urls[1:],
        sessions=2,
        schedule=SCHEDULE,
        output_tokens=16,
        ignore_eos=True,
        gpu="none",
        scrape_interval=0.2,
        **cfg,
    )
    run = Run(config, record=False)

    async def main() -> int:
        await run.prepare()
        if exporter is not None:
            exporter.state_of, exporter.clock, exporter.run = (lambda: run.state), run.clock, run.salt
            run.hub.listeners.append(exporter)
        return await run.drive()

    run.exit_code = asyncio.run(main())
    return run


def prometheus_binary() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        missing("PROMETHEUS", "no prometheus binary (Debian: apt-get install prometheus; .ci/run installs it)")
    return exe


@pytest.fixture
def prometheus(tmp_path):
    """Start a real Prometheus on loopback scraping the targets a test gives; yields (url, start)."""
    exe = prometheus_binary()
    started = []

    def start(jobs: dict[str, tuple[str, list[str]]]) -> str:
        port = free_port()
        lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 900ms", "scrape_configs:"]
        for job, (path, targets) in jobs.items():
            lines += [
                f"  - job_name: {job}",
                f"    metrics_path: {path}",
                "    static_configs:",
                f"      - targets: [{', '.join(repr(t) for t in targets)}]",
            ]
        (tmp_path / "prometheus.yml").write_text("\n".join(lines) + "\n")
        log = open(tmp_path / "prometheus.log", "w")
        started.append(
            procs.Popen(
                [
                    exe,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(url + "/-/ready") == 200, 60, "Prometheus did not become ready")
        return url

    yield start
    for p in started:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)


def _get(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def wait_for(cond, timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(why)
        time.sleep(0.25)


def query(prom: str, promql: str) -> list[dict]:
    r = httpx.get(prom + "/api/v1/query", params={"query": promql}, timeout=10).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


def host_port(url: str) -> str:
    return url.removeprefix("http://")


def test_two_nodes_of_eight_gpus_never_collide():
    with (
        ThreadedSim(make_profile("tiny"), gpus=8, node="node-a") as a,
        ThreadedSim(make_profile("tiny"), gpus=8, node="node-b") as b,
    ):
        texts = [httpx.get(s.url + DCGM_PATH).text for s in (a, b)]
    gpus = parse_dcgm(texts[0], node="ignored") + parse_dcgm(texts[1])
    assert len(gpus) == 16 and len({(g.node, g.index) for g in gpus}) == 16
    assert {g.node for g in gpus} == {"node-a", "node-b"} and all("simulated" in g.name for g in gpus)
    # Without a Hostname label the URL's host names the node.
    bare = re.sub(r',Hostname="[^"]*"', "", texts[0])
    assert {g.node for g in parse_dcgm(bare, node="10.0.0.7")} == {"10.0.0.7"}


def test_simulated_gpus_follow_the_engine(tmp_path):
    """Idle GPUs read 0%; while the engine steps they are busy."""
    with ThreadedSim(make_profile("tiny", time_scale=0.2), gpus=2) as s:
        idle = parse_dcgm(httpx.get(s.url + DCGM_PATH).text)
        time.sleep(0.3)
        idle = parse_dcgm(httpx.get(s.url + DCGM_PATH).text)
        busy: list[float] = []

        async def main() -> None:
            run = Run(
                RunConfig(
                    url=s.url,
                    sessions=2,
                    schedule=[4000, 8000],
                    output_tokens=64,
                    ignore_eos=True,
                    gpu=[s.url + DCGM_PATH],
                    scrape_interval=0.3,
                ),
                record=False,
            )
            await run.prepare()
            await run.drive()
            busy.extend(g.util for g in run.state.gpus if g.util is not None)

        asyncio.run(main())
    assert all(g.util == 0 for g in idle) and max(busy) > 20


def test_exporter_figures_match_the_report():
    """Scraped from the exporter's own HTTP endpoint, per session: TTFT sum and count, turns, needles, context."""
    exporter = ClientMetrics(lambda: None, time.monotonic)
    exporter.serve("127.0.0.1", 0)
    try:
        with ThreadedSim(make_profile("tiny")) as s:
            run = ramp([s.url], exporter)
        text = httpx.get(f"http://127.0.0.1:{exporter.port}/metrics").text
    finally:
        exporter.close()
    rep = build_report(run.state)
    for sess in rep.sessions:
        sid = sess.id

        def value(name: str, sid: str = sid, **labels: str) -> float:
            want = {"session": sid, "run": run.salt, **labels}
            found = [
                float(m.group(3))
                for m in SAMPLE_LINE.finditer(text)
                if m.group(1) == name and parse_labels(m.group(2)) == want
            ]
            assert len(found) == 1, (name, labels)
            return found[0]

        assert value("rampwatch_ttft_seconds_sum") == pytest.approx(sess.summary.ttft_sum_s, abs=1e-9)
        assert value("rampwatch_ttft_seconds_count") == len(SCHEDULE)
        assert value("rampwatch_turns_total", status="ok") == len(SCHEDULE)
        assert value("rampwatch_needle_found_total") == sess.summary.needle_found
        assert value("rampwatch_context_tokens") == sess.turns[-1].context_tokens
        assert value("rampwatch_decode_tokens_per_second") == pytest.approx(sess.turns[-1].decode_tok_s, rel=1e-9)
        assert value("rampwatch_turn") == len(SCHEDULE)


@pytest.mark.parametrize(
    "spec,match",
    [
        ('job="vllm"', Match('job="vllm"')),
        (
            'prefill:{job="llm-prefill", instance=~"10\\.0\\..*"}',
            Match('job="llm-prefill", instance=~"10\\.0\\..*"', "prefill"),
        ),
        ('decode:job="a:b,c"', Match('job="a:b,c"', "decode")),  # colons and commas inside a value are the value's
        ('pod!~"x"', Match('pod!~"x"')),
    ],
)
def test_prometheus_match_specs(spec, match):
    assert parse_match(spec) == match


@pytest.mark.parametrize("spec", ["job=vllm", 'job="a" pod="b"', 'job="a"}', "prefill:job"])
def test_prometheus_match_rejects_what_is_not_label_matchers(spec):
    with pytest.raises(ValueError, match="not PromQL label matchers"):
        parse_match(spec)


async def test_prometheus_reader_roles_errors_recovery_and_auth():
    """Each match's query names only the series the profiles read; what it finds carries its role; an
    instance two matches find keeps the first role; a match that finds nothing is said, and cleared when
    Prometheus answers again. Prometheus gets its own URL's credentials, nothing else."""
    asked: list[httpx.Request] = []
    down = False
    vllm = ["vllm:num_requests_running", "vllm:kv_cache_usage_perc"]

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if down:
            return httpx.Response(503)
        query = request.url.params["query"]
        result = [
            {"metric": {"__name__": name, "instance": inst, "job": job}, "value": [0, "0.5"]}
            for inst, job in (("p:8000", "prefill"), ("d:8000", "decode"))
            if f'job="{job}"' in query or 'instance=~"' in query
            for name in vllm
        ]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    got: list[ev.AnyEvent] = []
    reader = PrometheusReader(
        "http://watcher:s3cret@prom:9090",
        1.0,
        got.append,
        lambda: 1.0,
        gpu_matchers=None,
        matches=[parse_match('prefill:job="prefill"'), parse_match('decode:instance=~".*"'), parse_match('job="none"')],
    )
    reader._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    await reader.scrape_once()
    queries = [r.url.params["query"] for r in asked]
    assert all(q.startswith('{__name__=~"') and q.count("|") == len(ENGINE_SERIES) - 1 for q in queries)
    assert [q[q.index('",') + 1 :] for q in queries] == [',job="prefill"}', ',instance=~".*"}', ',job="none"}']
    assert all(r.headers["authorization"].startswith("Basic ") for r in asked)  # its own user:password
    roles = {e.source: e.role for e in got if isinstance(e, ev.MetricsSample)}
    assert roles == {"p:8000": "prefill", "d:8000": "decode"}
    errors = [e for e in got if isinstance(e, ev.MetricsError)]
    assert [(e.source, e.error) for e in errors] == [
        ("prometheus http://prom:9090", 'no vllm:, sglang: or llamacpp: series in Prometheus matching job="none"')
    ]
    state = RunState(ev.Header(rampwatch_version="0", command=[], mode="watch", server="http://prom:9090"))
    for e in got:
        state.apply(e)
    assert {ep.name: ep.role for ep in state.endpoints.values() if ep.last_sample_t} == roles
    assert panels.metrics_errors(state) == {"prometheus http://prom:9090": errors[0].error}

    reader.matches = reader.matches[:2]
    down, got[:] = True, []
    await reader.scrape_once()
    down = False
    await reader.scrape_once()
    await reader.scrape_once()
    errors = [e.error for e in got if isinstance(e, ev.MetricsError)]
    assert errors == ["HTTP 503, not a Prometheus API answer", ""]  # failing, then answering again (said once)
    for e in got:
        state.apply(e)
    assert panels.metrics_errors(state) == {}
    await reader.aclose()


async def test_prometheus_reads_what_no_other_source_names():
    """--metrics-url scrapes the engines: Prometheus is asked for the GPUs only (an engine read twice would
    count its tokens twice in the totals); --gpu names the GPUs: it is asked for the engines only."""
    both = RunConfig(url="http://e:8000", prometheus="http://p:9090", gpu=[], metrics_urls=["http://e:8000/metrics"])
    assert (both.prometheus_engines(), both.prometheus_gpus()) == (None, "")
    engines_only = RunConfig(
        url="http://e:8000",
        prometheus="http://p:9090",
        gpu=["http://n:9400/metrics"],
        prometheus_match=[Match('job="a"')],
    )
    assert (engines_only.prometheus_engines(), engines_only.prometheus_gpus()) == ([Match('job="a"')], None)
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params["query"])
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    reader = PrometheusReader(
        "http://p:9090",
        1.0,
        lambda e: None,
        lambda: 1.0,
        matches=both.prometheus_engines(),
        gpu_matchers=both.prometheus_gpus(),
    )
    reader._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    await reader.scrape_once()
    await reader.aclose()
    assert len(asked) == 1 and "DCGM_FI_DEV_GPU_UTIL" in asked[0] and "vllm:" not in asked[0]


def test_prefill_in_flight_grows_while_a_prefill_waits():
    from tests.folding import fold

    sent = ev.RequestSent(t=2.0, session="s1", turn=3, target_tokens=1, new_tokens_est=1, body_bytes=1)
    state, exporter = fold(None, [sent], clock=lambda: 5.0, run="r")
    assert list(exporter.prefills()) == [("s1", 3.0)]
    first = ev.FirstToken(t=4.0, session="s1", turn=3)
    state.apply(first)
    exporter(first)
    assert list(exporter.prefills()) == []


def test_the_grafana_dashboard_queries_only_series_that_exist(tmp_path):
    out = tmp_path / "dashboard.json"
    p = procs.run([*rampwatch_cmd(), "export", "--grafana-dashboard", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    dash = json.loads(out.read_text())
    vllm = set(re.findall(r"^(vllm:[a-zA-Z0-9_:]+)", (DATA / "vllm-0.32.0-cpu-metrics.txt").read_text(), re.M))
    exprs = [t["expr"] for panel in dash["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    for expr in exprs:
        names = re.findall(r"\b(rampwatch_[a-z_]+|vllm:[a-zA-Z0-9_:]+)", expr)
        assert names, expr
        for name in names:
            if name.startswith("rampwatch_"):
                assert re.sub(r"_(bucket|sum|count|total)$", "", name) in SERIES, name
            else:
                assert name in vllm, name


def test_prometheus_reads_the_fleet_and_rampwatchs_own_figures(prometheus, tmp_path):
    """A real Prometheus scrapes two simulated engines, their two simulated dcgm-exporters (8 GPUs a
    node) and rampwatch's exporter; `watch --prometheus` shows both engines and all 16 GPUs, and the
    exporter's series read back through Prometheus's API match the run's report."""
    exporter = ClientMetrics(lambda: None, time.monotonic)
    exporter.serve("127.0.0.1", 0)
    try:
        with (
            ThreadedSim(make_profile("tiny"), gpus=8, node="node-a") as a,
            ThreadedSim(make_profile("tiny"), gpus=8, node="node-b") as b,
        ):
            engines = [host_port(a.url), host_port(b.url)]
            prom = prometheus(
                {
                    "vllm": ("/metrics", engines),
                    "dcgm": (DCGM_PATH, engines),
                    "rampwatch": ("/metrics", [f"127.0.0.1:{exporter.port}"]),
                }
            )
            wait_for(lambda: len([r for r in query(prom, "up") if r["value"][1] == "1"]) == 5, 60, "targets not up")
            run = ramp([a.url, b.url], exporter)
            assert run.exit_code == 0
            # The exporter's series, read back through Prometheus (while it still serves them: a target that
            # goes away has its series marked stale), are the run's report.
            # A scrape can fall between a turn's first token (its TTFT) and its end (its count): wait for a scrape
            # that holds all of them final.
            rep = build_report(run.state)
            expected = {
                f'rampwatch_ttft_seconds_sum{{run="{run.salt}"}}': {s.id: s.summary.ttft_sum_s for s in rep.sessions},
                f'rampwatch_turns_total{{run="{run.salt}",status="ok"}}': {
                    s.id: float(len(s.turns)) for s in rep.sessions
                },
                f'rampwatch_needle_found_total{{run="{run.salt}"}}': {
                    s.id: float(s.summary.needle_found) for s in rep.sessions
                },
            }
            held: dict[str, dict[str, float]] = {}

            def final() -> bool:
                held.update({promql: by_session(query(prom, promql)) for promql in expected})
                return all(held[q] == pytest.approx(want, abs=1e-6) for q, want in expected.items())

            wait_for(final, 30, "Prometheus never held the run's final TTFT sums, turns and needles together")

            # The whole fleet; and the same fleet narrowed by label matchers, with roles (a prefill/decode split
            # read through Prometheus): engine a is the first match's prefill, b the second's decode, GPUs node-a's.
            recs = {"all": tmp_path / "watch.jsonl", "matched": tmp_path / "matched.jsonl"}
            narrowed = [
                "--prometheus-match",
                f'prefill:instance="{engines[0]}"',
                "--prometheus-match",
                'decode:job="vllm"',
                "--prometheus-gpu-match",
                'Hostname="node-a"',
            ]
            watches = [
                procs.Popen(
                    [
                        *rampwatch_cmd(),
                        "watch",
                        "--prometheus",
                        prom,
                        "--headless",
                        "--record",
                        str(rec),
                        "--scrape-interval",
                        "0.5",
                        *(narrowed if name == "matched" else []),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for name, rec in recs.items()
            ]
            try:
                for rec in recs.values():
                    wait_for(
                        lambda rec=rec: rec.exists() and rec.read_bytes().count(b'"GpuSample"') >= 6,
                        60,
                        "watch read no GPUs",
                    )
            finally:
                for watch in watches:
                    watch.send_signal(signal.SIGINT)
                    out, err = watch.communicate(timeout=30)
                    assert watch.returncode == 130, err
    finally:
        exporter.close()

    def replayed(rec: Path) -> RunState:
        back = read_recording(rec)
        state = RunState(back.header)
        for e in back.events:
            state.apply(e)
        return state

    state = replayed(recs["all"])
    assert sorted(ep.name for ep in state.endpoints.values() if ep.last_sample_t is not None) == sorted(engines)
    assert all(ep.engine == "vllm" for ep in state.endpoints.values() if ep.last_sample_t is not None)
    assert len(state.gpus) == 16
    assert {n for n, _ in panels.gpu_nodes(state)} == {"node-a", "node-b"}  # the exporters' Hostname, not the instance
    assert not panels.metrics_errors(state)
    state = replayed(recs["matched"])
    assert {ep.name: ep.role for ep in state.endpoints.values() if ep.last_sample_t} == {
        engines[0]: "prefill",
        engines[1]: "decode",
    }
    assert len(state.gpus) == 8 and {n for n, _ in panels.gpu_nodes(state)} == {"node-a"}
    assert not panels.metrics_errors(state)


def test_a_real_vllm_read_through_prometheus_shows_what_its_own_metrics_show(prometheus, vllm_server, tmp_path):
    """Real vLLM series through a real Prometheus (labels rewritten, info series, counters as stored) give
    the Server panel the figures a direct scrape of the same server gives, with a ramp in between."""
    prom = prometheus({"vllm": ("/metrics", [host_port(vllm_server)])})
    wait_for(lambda: any(r["value"][1] == "1" for r in query(prom, 'up{job="vllm"}')), 60, "vLLM target not up")
    rec = tmp_path / "through.jsonl"
    p = procs.run(
        [
            *rampwatch_cmd(),
            "run",
            vllm_server,
            "--scale-to",
            "4k",
            "--output-tokens",
            "8",
            "--ignore-eos",
            "--prometheus",
            prom,
            "--prometheus-match",
            'job="vllm"',
            "--headless",
            "--record",
            str(rec),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    _, direct, _ = normalize(httpx.get(vllm_server + "/metrics").text)
    got: list[ev.AnyEvent] = []

    async def read_once() -> None:
        reader = PrometheusReader(prom, 1.0, got.append, lambda: 0.0, matches=[Match('job="vllm"')], gpu_matchers=None)
        await reader.scrape_once()
        await reader.aclose()

    asyncio.run(read_once())
    [sample] = [e for e in got if isinstance(e, ev.MetricsSample)]
    assert sample.engine == "vllm" and sample.source == host_port(vllm_server) and not sample.missing
    for name in (
        "kv_capacity_tokens",
        ENGINE_POOL,
        "prompt_tokens",
        "generation_tokens",
        "prefix_queries",
        "prefix_hits",
    ):
        assert sample.values[name] == direct[name], name  # counters at rest: the same number both ways
    back = read_recording(rec)
    samples = [e for e in back.events if isinstance(e, ev.MetricsSample)]
    assert samples and all(e.source == host_port(vllm_server) and e.role == "both" for e in samples)
    # The run's last read waited for Prometheus's next scrape: the totals cover the last turn.
    rep = json.loads(
        procs.run(
            [*rampwatch_cmd(), "report", str(rec), "--format", "json"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert rep["servers"][0]["generation_tokens"] == 10 * 8


def test_a_matcher_prometheus_cannot_parse_is_refused_before_the_run(prometheus):
    prom = prometheus({})
    p = procs.run(
        [
            *rampwatch_cmd(),
            "watch",
            "--prometheus",
            prom,
            "--prometheus-match",
            'job=~"("',
            "--headless",
            "--no-record",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"Prometheus at {prom}: query failed:" in p.stderr and "Traceback" not in p.stderr


def by_session(result: list[dict]) -> dict[str, float]:
    return {r["metric"]["session"]: float(r["value"][1]) for r in result}


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_two_nodes_of_gpus_snapshot(snap_compare, size):
    """2 nodes x 8 GPUs: one line per GPU at 120x40, one line per node in the compact form."""
    gpus = [
        ev.GpuReading(
            index=k,
            node=node,
            name="NVIDIA H200 (simulated)",
            util=40.0 + 7 * k + (20 if node == "node-b" else 0),
            mem_used=(80 + k) * 2**30,
            mem_total=141 * 2**30,
            power=300.0 + 30 * k,
            sm_clock=1980.0,
            temp=50.0 + k,
        )
        for node in ("node-a", "node-b")
        for k in range(8)
    ]
    header = ev.Header(
        rampwatch_version="0",
        command=[],
        mode="watch",
        server="http://prometheus:9090",
        model="m",
        engine="vllm",
        started_at="2026-11-29T00:00:00Z",
    )
    events = [
        ev.GpuSample(t=1.0, source=f"prometheus {n}:9400", gpus=[g for g in gpus if g.node == n])
        for n in ("node-a", "node-b")
    ]
    src = ReplaySource(Recording(header=header, events=events))
    src.seek(2.0)
    src.paused = True
    assert snap_compare(RampwatchApp(src, autostart=False), terminal_size=size)
