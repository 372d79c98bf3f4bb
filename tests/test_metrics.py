"""Engine profiles on real /metrics captures (tests/data, copied from the reference samples)."""

from __future__ import annotations

import re
from base64 import b64encode

import pytest

from rampwatch.drivers.telemetry.gpu import parse_dcgm
from rampwatch.drivers.telemetry.metrics import MetricsFormatError, MetricsScraper, normalize
from tests.conftest import DATA


def sources(name: str) -> list[str]:
    """A multi-source sample file split on its '# ---- SOURCE' markers, '...' elisions dropped."""
    text = (DATA / name).read_text()
    parts = re.split(r"^# ---- SOURCE.*$", text, flags=re.M)[1:]
    return ["\n".join(line for line in p.splitlines() if line.strip() != "...") for p in parts]


def test_vllm_032_cpu_capture():
    engine, v, missing = normalize((DATA / "vllm-0.32.0-cpu-metrics.txt").read_text())
    assert engine == "vllm" and not missing
    # The capture's documented figures: 146,552 prompt tokens, 50,944 from cache, 95,608 computed, 400 generated.
    assert v["prompt_tokens"] == 146_552 and v["prefix_queries"] == 146_552
    assert v["prefix_hits"] == 50_944 and v["prompt_computed"] == 95_608
    assert v["generation_tokens"] == 400
    assert v["kv_usage"] == 0.0 and v["running"] == 0 and v["waiting"] == 0
    assert v["kv_capacity_tokens"] == 4_194_304
    assert v["ttft_count"] == 4


def test_vllm_033_synthetic_capacity_from_blocks():
    text = (DATA / "synthetic-vllm-0.33.0-metrics.txt").read_text()
    engine, v, _ = normalize(text)
    info = re.search(r"vllm:cache_config_info\{([^}]*)\}", text).group(1)
    blocks = int(re.search(r'num_gpu_blocks="(\d+)"', info).group(1))
    size = int(re.search(r'block_size="(\d+)"', info).group(1))
    assert engine == "vllm" and v["kv_capacity_tokens"] == blocks * size


def test_vllm_old_aliases_and_new_names_side_by_side():
    old_docs, design, glm, router = sources("vllm_metrics.txt")
    engine, v, missing = normalize(design)
    assert engine == "vllm" and v["running"] == 8 and v["generation_tokens"] == 27453
    assert "kv_usage" in missing  # not in this excerpt: unavailable, not 0
    _, v, _ = normalize(glm)
    assert v["prefix_queries"] == 32.0  # the new name wins over the deprecated alias
    _, v, _ = normalize(router)
    assert "kv_usage" in v  # gpu_cache_usage_perc, the pre-0.12 alias


def test_vllm_sums_engines_and_maxes_fractions():
    text = "\n".join(
        [
            'vllm:num_requests_running{engine="0",model_name="m"} 2',
            'vllm:num_requests_running{engine="1",model_name="m"} 3',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75',
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 100',
            'vllm:prompt_tokens_total{engine="1",model_name="m"} 50',
        ]
    )
    _, v, _ = normalize(text)
    assert v["running"] == 5 and v["kv_usage"] == 0.75 and v["prompt_tokens"] == 150


def test_sglang_sources():
    docs, v051, pd = sources("sglang_metrics.txt")
    engine, v, missing = normalize(docs)
    assert engine == "sglang" and v["kv_usage"] == 0.28 and v["running"] == 162
    assert v["prompt_tokens"] == 8_128_902
    assert "preemptions" in missing and "SGLang" in missing["preemptions"]
    _, v, _ = normalize(v051)
    assert v["running"] == 1 and v["kv_usage"] == 0.0
    _, v, _ = normalize(pd)
    assert v["prefix_hits"] == 2688


def test_sglang_tensor_parallel_ranks_are_not_added():
    text = (
        'sglang:num_running_reqs{tp_rank="0",model_name="m"} 4\nsglang:num_running_reqs{tp_rank="1",model_name="m"} 4\n'
    )
    _, v, _ = normalize(text)
    assert v["running"] == 4


def test_llamacpp_cached_counter_and_missing_kv():
    engine, v, missing = normalize((DATA / "synthetic-llamacpp-0c1e57098-metrics.txt").read_text())
    assert engine == "llama.cpp"
    assert v["prompt_computed"] == 1_234_570  # 1.23457e+06: six significant digits as written
    assert v["prefix_hits"] == 802_211 and v["prefix_queries"] == 1_234_570 + 802_211
    assert "kv_usage" in missing and "llama.cpp" in missing["kv_usage"]


def test_llamacpp_real_scrapes():
    excerpt, full, fork = sources("llamacpp_metrics.txt")
    for part, generated in ((excerpt, 673), (full, None), (fork, 3469)):
        engine, v, missing = normalize(part)
        assert engine == "llama.cpp" and "generation_tokens" in v
        if generated is not None:
            assert v["generation_tokens"] == generated
            assert "running" in missing  # truncated excerpts: unavailable, not 0
    # The complete scrape predates prompt_tokens_cached_total: hit rate unavailable, not 0.
    _, v, missing = normalize(full)
    assert "running" in v and "waiting" in v
    assert "prefix_hits" not in v and "prefix_queries" in missing


def test_unknown_and_garbage():
    engine, v, missing = normalize('http_requests_total{handler="/v1"} 3\n')
    assert engine == "unknown" and not v and "disable-log-stats" in missing["kv_usage"]
    with pytest.raises(MetricsFormatError):
        normalize("<html>not metrics</html>")
    with pytest.raises(MetricsFormatError):
        normalize('vllm:num_requests_running{engine="0"} twelve\n')


def test_dcgm_units():
    text = "\n".join(
        [
            'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="u0",modelName="NVIDIA H200"} 87',
            'DCGM_FI_DEV_FB_USED{gpu="0",UUID="u0",modelName="NVIDIA H200"} 1024',
            'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="u0",modelName="NVIDIA H200"} 3072',
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="u0",modelName="NVIDIA H200"} 512.5',
            'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="u1",modelName="NVIDIA H200"} 3',
        ]
    )
    g0, g1 = parse_dcgm(text)
    assert g0.name == "NVIDIA H200" and g0.util == 87 and g0.power == 512.5
    assert g0.mem_used == 1024 * 2**20 and g0.mem_total == 4096 * 2**20
    assert g1.index == 1 and g1.mem_used is None


async def test_a_slow_nvml_start_leaves_the_event_loop_running():
    """nvmlInit and the device names run off the loop: the sessions' coroutines keep stamping meanwhile."""
    import asyncio
    import time

    from rampwatch.drivers.model import events as ev
    from rampwatch.drivers.telemetry.gpu import GpuSampler
    from tests.faults import BrokenNvml

    class SlowStartNvml(BrokenNvml):
        """Starts in INIT_S (a loaded node's driver), then reads one GPU's utilisation (nothing else supported)."""

        INIT_S = 0.5

        class Util:
            gpu = 50

        def nvmlInit(self) -> None:
            time.sleep(self.INIT_S)

        def nvmlDeviceGetUtilizationRates(self, h):
            return self.Util()  # noqa: E704

        def __getattr__(self, name: str):
            def unsupported(*a):
                err = BrokenNvml.NVMLError("Not Supported")
                err.value = 3  # NVML_ERROR_NOT_SUPPORTED: the field reads as unknown
                raise err

            return unsupported

    got: list[ev.AnyEvent] = []
    ticks: list[float] = []

    async def ticker() -> None:  # stands in for a session stamping its tokens
        while not got:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    start = time.monotonic()
    sampler = asyncio.create_task(GpuSampler("auto", 0.05, got.append, lambda: 0.0, nvml=SlowStartNvml()).run())
    await asyncio.wait_for(ticker(), timeout=10)
    sampler.cancel()
    assert isinstance(got[0], ev.GpuSample) and got[0].gpus[0].util == 50
    during_init = [t for t in ticks if t - start < SlowStartNvml.INIT_S]
    assert len(during_init) >= 10, f"the loop ticked {len(during_init)} times while NVML started"
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < SlowStartNvml.INIT_S  # never blocked for the whole start


def test_a_scrape_url_splits_into_its_host_its_path_and_its_credentials():
    """user:password@ goes as Basic auth (never in the Host header), for that URL over --metrics-auth-env's
    token (as httpx sent it); an IPv6 literal keeps its brackets; the query stays on the path."""
    s = MetricsScraper("http://u:p%40ss@[::1]:9090/metrics?name=x", 0.5, lambda e: None, lambda: 0.0)
    assert (s._conn.host, s._conn.port, s._conn.host_header) == ("::1", 9090, "[::1]:9090")
    assert s._path == "/metrics?name=x" and s._headers == {"Authorization": "Basic " + b64encode(b"u:p@ss").decode()}
    both = MetricsScraper("https://u:p@h.example/metrics", 0.5, lambda e: None, lambda: 0.0, {"Authorization": "B"})
    assert both._conn.https and both._conn.port == 443 and both._headers == {"Authorization": "Basic dTpw"}
    token = MetricsScraper("https://h.example/metrics", 0.5, lambda e: None, lambda: 0.0, {"Authorization": "B"})
    assert token._headers == {"Authorization": "B"}
