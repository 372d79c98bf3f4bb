"""--trace-kv-tokens against a simulated engine whose pool is that size (issue 35): with one request at a time, the
engine's measured cached tokens are the LRU pool's ideal on every turn, block for block, and fall below the
unbounded ideal exactly where the model says the pool evicted a prefix's tail (the replies' blocks took the room):
end to end through `rampwatch demo --trace`, and on the engine alone over random traces."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from rampwatch.drivers.model.trace import TraceRequest
from rampwatch.drivers.model.trace_reuse import IdealReuse, held_blocks
from rampwatch.drivers.sim.engine import SimEngine
from rampwatch.drivers.sim.profiles import make_profile
from tests.test_sim import _finish
from tests.test_trace_replay import replay, sends_and_ends

BLOCK = 64
POOL_BLOCKS = 10  # the largest request below holds 9 blocks by its end

# (session, hash ids, input_length, output_length): three sessions opening with the same two blocks and growing,
# a turn every 10 s of the trace (0.5 s at the demo's time scale of 20), no prompt a whole number of blocks. With
# 10 blocks, worked by hand (trace_reuse.py's rules): b's turn 2 finds 1,2 but not 20, and a's turn 3 finds
# 1,2,10 but not 11, evicted by the turns between them, replies included; unbounded, they find 3 and 6 blocks (and
# a pool holding prompt blocks alone would have kept both prefixes whole).
ROWS = [
    ("a", [1, 2, 10, 11, 12], 300, 100),
    ("b", [1, 2, 20, 21], 226, 100),
    ("a", [1, 2, 10, 11, 12, 13, 14], 428, 64),
    ("c", [1, 2, 30], 150, 100),
    ("b", [1, 2, 20, 21, 22, 23], 360, 64),
    ("a", [1, 2, 10, 11, 12, 13, 14, 15], 500, 64),
    ("c", [1, 2, 30, 31, 32], 300, 64),
]
# (session, turn) -> (ideal cached tokens unbounded, with the pool)
IDEAL = {
    ("a", 1): (0, 0),
    ("b", 1): (128, 128),
    ("a", 2): (256, 256),
    ("c", 1): (128, 128),
    ("b", 2): (192, 128),
    ("a", 3): (384, 192),
    ("c", 2): (128, 128),
}


def write_trace(path: Path) -> Path:
    rows = [
        {"session_id": s, "timestamp": i * 10_000, "input_length": n, "output_length": out, "hash_ids": ids}
        for i, (s, ids, n, out) in enumerate(ROWS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_small_pool_caches_exactly_what_the_lru_model_says_turn_by_turn(tmp_path):
    record = tmp_path / "pool.jsonl"
    pool = str(POOL_BLOCKS * BLOCK)
    rep = replay(
        write_trace(tmp_path / "trace.jsonl"), record, "fast", BLOCK,
        "--kv-tokens", pool, "--trace-block-size", str(BLOCK), "--trace-kv-tokens", pool,
        "--trace-timing", "session", "--ignore-eos",
    )  # fmt: skip
    # The model's premise held: each turn was sent after the one before it had ended.
    times = sorted(sends_and_ends(record).values(), key=lambda t: t[1])
    assert all(done < sent for (_, _, done), (_, sent, _) in zip(times, times[1:])), times
    rows = {(s["id"], r["turn"]): r for s in rep["sessions"] for r in s["turns"]}
    assert set(rows) == set(IDEAL)
    for key, (unbounded, pooled) in IDEAL.items():
        row = rows[key]
        assert row["error"] is None, row
        assert (row["ideal_cached_tokens"], row["ideal_cached_pool_tokens"]) == (unbounded, pooled), key
        assert row["cached_tokens"] == pooled, (key, row)
    run = rep["reuse"]["run"]
    assert run["efficiency_pool"] == 1.0
    assert run["efficiency"] == pytest.approx(960 / 1216)  # short by b's turn 2 and a's turn 3 alone


def random_trace(seed: int) -> list[TraceRequest]:
    """Sessions opening with some of a few shared blocks, each turn growing one of them by 1-3 blocks, its prompt
    never a whole number of blocks (where it is and every block hits, vLLM recomputes the last block, the
    simulated engine the last token), its reply 1-200 tokens."""
    rng = random.Random(seed)
    ids = iter(range(1000, 10**6))
    shared = [next(ids) for _ in range(rng.randint(1, 4))]
    sessions = [shared[: rng.randint(0, len(shared))] for _ in range(rng.randint(2, 5))]
    out = []
    for k in range(rng.randint(5, 14)):
        s = rng.randrange(len(sessions))
        sessions[s] = [*sessions[s], *(next(ids) for _ in range(rng.randint(1, 3)))]
        n = len(sessions[s]) * BLOCK - rng.randint(1, BLOCK - 1)
        out.append(TraceRequest(session=str(s), turn=1, due_s=k, input_length=n, output_length=rng.randint(1, 200),
                                hash_ids=sessions[s]))  # fmt: skip
    return out


def prompt(request: TraceRequest) -> bytes:
    """The request's prompt for the engine's tokenizer (4 bytes a token): a block of letters per hash id."""
    text = b"".join(random.Random(h).randbytes(BLOCK * 4).translate(bytes(97 + b % 26 for b in range(256)))
                    for h in request.hash_ids)  # fmt: skip
    return text[: request.input_length * 4]


async def served_one_at_a_time(trace: list[TraceRequest], pool_blocks: int, burst: int) -> list[int]:
    engine = SimEngine(make_profile("fast", block_size=BLOCK, kv_tokens=pool_blocks * BLOCK, burst=burst))
    cached = []
    for r in trace:
        req = await _finish(engine, engine.make_request(prompt(r), r.output_length, ignore_eos=True))
        assert req.generated == r.output_length and req.preemptions == 0
        cached.append(req.cached_tokens)
    return cached


@pytest.mark.parametrize("burst", [1, 8])
def test_the_engine_alone_keeps_what_the_model_says_on_random_traces(burst):
    evicted = 0
    for seed in range(30):
        trace = random_trace(seed)
        pool_blocks = max(held_blocks(r, BLOCK) for r in trace) + seed % 8
        reuse = IdealReuse(BLOCK, pool_blocks * BLOCK)
        ideal = [reuse.observe(r) for r in trace]
        assert asyncio.run(served_one_at_a_time(trace, pool_blocks, burst)) == [p for _, p in ideal], seed
        evicted += any(p < u for u, p in ideal)
    assert evicted >= 10  # most of them made the pool evict a prefix
