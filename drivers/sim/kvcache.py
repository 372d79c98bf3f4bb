"""The simulated KV pool: fixed blocks with a block-hashed prefix cache.

Like vLLM's: full prompt blocks are hashed with their whole prefix, so a
growing conversation finds its earlier blocks again. A block no request holds
is free: blocks never used are handed out first, then freed ones, least
recently freed first, a hashed one losing its place in the cache as it goes.
A request's blocks are freed tail first, so its prefix's head is evicted last.
"""

from __future__ import annotations

from collections import OrderedDict


class KVPool:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.never_used = num_blocks  # blocks with no content at all
        self.refs: dict[int, int] = {}  # block id -> holders
        self.cached: dict[bytes, int] = {}  # prefix hash -> block id
        self.hash_of: dict[int, bytes] = {}
        # Freed blocks, least recently freed first: vLLM's free queue, where a freed block with no hash (a partial
        # block, the reply's) waits its turn like a cached one, so that taking it spares no older cached block.
        self.freed: OrderedDict[int, None] = OrderedDict()
        self._next_id = 0

    @property
    def used(self) -> int:
        return len(self.refs)

    @property
    def free(self) -> int:
        return self.never_used + len(self.freed)

    def usage(self) -> float:
        return self.used / self.num_blocks

    def match(self, hashes: list[bytes]) -> list[int]:
        """The longest run of cached blocks for this prefix, now held."""
        blocks = []
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            blocks.append(b)
        for b in blocks:
            self._hold(b)
        return blocks

    def _hold(self, b: int) -> None:
        if b in self.freed:
            del self.freed[b]
        self.refs[b] = self.refs.get(b, 0) + 1

    def allocate(self, n: int) -> list[int] | None:
        """n fresh blocks, evicting cached ones if needed; None when the pool is full."""
        if n > self.free:
            return None
        out = []
        for _ in range(n):
            if self.never_used:
                self.never_used -= 1
                b = self._next_id
                self._next_id += 1
            else:
                b, _ = self.freed.popitem(last=False)
                h = self.hash_of.pop(b, None)
                if h is not None and self.cached.get(h) == b:
                    del self.cached[h]
            self.refs[b] = 1
            out.append(b)
        return out

    def register(self, block: int, h: bytes) -> None:
        """A block just filled with prompt tokens becomes findable by its prefix hash."""
        if h not in self.cached:
            self.cached[h] = block
            self.hash_of[block] = h

    def release(self, blocks: list[int]) -> None:
        """A request's blocks, in prefix order, let go: freed tail first (as vLLM frees them), so the head of a
        prefix, which more requests share, is the last of them to be evicted."""
        for b in reversed(blocks):
            n = self.refs[b] - 1
            if n:
                self.refs[b] = n
                continue
            del self.refs[b]
            self.freed[b] = None
