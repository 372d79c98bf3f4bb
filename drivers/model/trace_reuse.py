"""Ideal reuse: how many of each request's prompt tokens a prefix cache could have served, from the trace's
hash ids alone, before anything is sent.

A request's ideal cached tokens are its longest run of leading blocks already sent by the requests due before
it (all sessions, in due order; ties in file order), times the block size:
- unbounded: every block ever sent is still there;
- with a pool of N tokens: what a pool of N // block_size blocks still holds when the requests are served one at
  a time in due order (each ends before the next is sent), each reply is its output_length, and the pool frees
  and evicts blocks as vLLM's does. A request holds its hit and takes its other blocks (the rest of its prompt,
  then its reply: ceil((input_length + output_length - 1) / block_size) in all, the last token's KV is never
  computed) from the free blocks: never used first, then the least recently freed, evicting what they held. When
  it ends, its blocks are freed tail first (the reply's, the partial one, then the prompt's full blocks last to
  first), so a prefix's head is evicted last. Only the prompt's full blocks can be found again: no later prompt
  of a trace holds a reply, so the reply's blocks only take room. A request longer than the pool (which an engine
  would refuse) keeps its first blocks.
  That is exactly what an engine with the trace's block size gives when no two requests are in flight at once.
  Requests in flight together hold more blocks at once, so a real pool may keep less; an engine with smaller
  blocks evicts in smaller steps, so it keeps about as much, not exactly.

Only full blocks count. A prompt whose length is not a multiple of the block size ends in a partial block: it
is never counted as cached and never enters the cache (a block-hashed prefix cache keys full blocks only), so a
request's ideal is a whole number of blocks, at most its input_length rounded down to a block. And never the
whole prompt: an engine computes at least its last token (the first output token's logits come from it), so a
prompt found whole is ideally cached to its input_length less one (vLLM reports a block less: its 16 tokens).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from rampwatch.drivers.model.trace import TraceRequest


def full_blocks(request: TraceRequest, block_size: int) -> int:
    """How many of the request's blocks are full: the ones a prefix cache can hold and find again."""
    return min(request.input_length // block_size, len(request.hash_ids))


def held_blocks(request: TraceRequest, block_size: int) -> int:
    """How many blocks the request holds by its end: its prompt and its reply but the last token, whose KV no step
    computes (the request ends as it is sampled)."""
    return -(-(request.input_length + request.output_length - 1) // block_size)


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
    """The full blocks a pool of `capacity` blocks still holds, requests served one at a time, as vLLM frees and
    evicts blocks: a request holds its hit and takes its other blocks (prompt and reply) from the free ones, never
    used first, then least recently freed (evicting what they held); when it ends its blocks are freed tail first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._never_used = capacity
        # Freed blocks, least recently freed first: a full prompt block by its hash id, any other block (a partial
        # one, the reply's) as an object() that nothing will find.
        self._freed: OrderedDict[object, None] = OrderedDict()

    def send(self, hash_ids: Sequence[int], full: int, held: int) -> int:
        """The leading full blocks still held (the hit), for a request that holds `held` blocks by its end."""
        freed = self._freed
        hit = _leading_run(hash_ids, full, freed)
        # A request longer than the pool (which an engine would refuse) is taken to keep its first blocks.
        held = min(held, self.capacity)
        kept = min(full, held)
        for h in hash_ids[:hit]:
            freed.pop(h, None)  # held by the request now (an id twice in one prompt is one block)
        new = held - hit
        for _ in range(new - min(new, self._never_used)):
            freed.popitem(last=False)  # evicted
        for _ in range(held - kept):
            freed[object()] = None
        for h in reversed(hash_ids[:kept]):
            freed.pop(h, None)  # an older copy (below) goes: the freed order is this request's
            freed[h] = None
        # Hash ids name their whole prefix, so a block after a miss is held nowhere else; where a trace's ids do
        # not, the older copy is moved here, and the block it was in is empty again.
        self._never_used = self.capacity - len(freed)
        return hit


class IdealReuse:
    """Each request's ideal cached tokens, unbounded and with a pool of `pool_tokens`, fed in due order."""

    def __init__(self, block_size: int, pool_tokens: int | None = None):
        self.block_size = block_size
        self.unbounded = UnboundedPrefixCache()
        self.pool = None if pool_tokens is None else LruPrefixCache(pool_tokens // block_size)

    def observe(self, request: TraceRequest) -> tuple[int, int | None]:
        """(unbounded, with the pool or None) cached tokens of `request`, which is then sent."""
        full = full_blocks(request, self.block_size)
        most = request.input_length - 1  # the last prompt token is always computed
        unbounded = min(most, self.unbounded.send(request.hash_ids, full) * self.block_size)
        if self.pool is None:
            return unbounded, None
        pooled = self.pool.send(request.hash_ids, full, held_blocks(request, self.block_size))
        return unbounded, min(most, pooled * self.block_size)


def annotate_ideal(
    requests: Iterable[TraceRequest], block_size: int, pool_tokens: int | None = None
) -> Iterator[TraceRequest]:
    """The requests (in due order) with `ideal_cached` and, given a pool, `ideal_cached_pool` set."""
    reuse = IdealReuse(block_size, pool_tokens)
    for r in requests:
        r.ideal_cached, r.ideal_cached_pool = reuse.observe(r)
        yield r
