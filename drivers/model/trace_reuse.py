"""Ideal reuse: how many of each request's prompt tokens a prefix cache could have served, from the trace's
hash ids alone, before anything is sent.

A request's ideal cached tokens are its longest run of leading blocks already sent by the requests due before
it (all sessions, in due order; ties in file order), times the block size:
- unbounded: every block ever sent is still there;
- with a pool of N tokens: an LRU cache of N // block_size blocks. A request's hit touches its blocks; its
  other blocks are inserted, evicting the least recently used. Its blocks are touched tail first, so its head
  is the most recently used: eviction takes a prefix's tail before its head (as vLLM frees blocks), and a
  request longer than the pool keeps its leading blocks.

Only full blocks count. A prompt whose length is not a multiple of the block size ends in a partial block: it
is never counted as cached and never enters the cache (a block-hashed prefix cache keys full blocks only), so a
request's ideal is a whole number of blocks, at most its input_length rounded down to a block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from rampwatch.drivers.model.trace import TraceRequest


def full_blocks(request: TraceRequest, block_size: int) -> int:
    """How many of the request's blocks are full: the ones a prefix cache can hold and find again."""
    return min(request.input_length // block_size, len(request.hash_ids))


def _leading_run(hash_ids: Sequence[int], full: int, held: set[int] | OrderedDict[int, None]) -> int:
    hit = 0
    while hit < full and hash_ids[hit] in held:
        hit += 1
    return hit


class UnboundedPrefixCache:
    """Every full block ever sent."""

    def __init__(self) -> None:
        self._blocks: set[int] = set()

    def send(self, hash_ids: Sequence[int], full: int) -> int:
        """The leading full blocks already held (the hit); then the request's full blocks are held."""
        hit = _leading_run(hash_ids, full, self._blocks)
        self._blocks.update(hash_ids[hit:full])
        return hit

    def __len__(self) -> int:
        return len(self._blocks)


class LruPrefixCache:
    """The full blocks an LRU pool of `capacity` blocks still holds."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently used first

    def send(self, hash_ids: Sequence[int], full: int) -> int:
        """The leading full blocks still held (the hit); then the request's blocks are touched or inserted,
        tail first, evicting the least recently used."""
        lru = self._lru
        hit = _leading_run(hash_ids, full, lru)
        # A request longer than the pool ends holding its first `capacity` blocks whatever came before them,
        # so only those are walked.
        for h in reversed(hash_ids[: min(full, self.capacity)]):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                if len(lru) > self.capacity:
                    lru.popitem(last=False)
        return hit

    def __len__(self) -> int:
        return len(self._lru)


class IdealReuse:
    """Each request's ideal cached tokens, unbounded and with a pool of `pool_tokens`, fed in due order."""

    def __init__(self, block_size: int, pool_tokens: int | None = None):
        self.block_size = block_size
        self.unbounded = UnboundedPrefixCache()
        self.pool = None if pool_tokens is None else LruPrefixCache(pool_tokens // block_size)

    def observe(self, request: TraceRequest) -> tuple[int, int | None]:
        """(unbounded, with the pool or None) cached tokens of `request`, which is then sent."""
        full = full_blocks(request, self.block_size)
        unbounded = self.unbounded.send(request.hash_ids, full) * self.block_size
        pooled = None if self.pool is None else self.pool.send(request.hash_ids, full) * self.block_size
        return unbounded, pooled


def annotate_ideal(
    requests: Iterable[TraceRequest], block_size: int, pool_tokens: int | None = None
) -> Iterator[TraceRequest]:
    """The requests (in due order) with `ideal_cached` and, given a pool, `ideal_cached_pool` set."""
    reuse = IdealReuse(block_size, pool_tokens)
    for r in requests:
        r.ideal_cached, r.ideal_cached_pool = reuse.observe(r)
        yield r
