"""The simulated KV pool: fixed blocks with a block-hashed prefix cache.

Like vLLM's: full prompt blocks are hashed with their whole prefix, so a
growing conversation finds its earlier blocks again; blocks no request
holds stay cached but count as free, and are evicted least recently used.
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
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unheld, oldest first
        self._next_id = 0

    @property
    def used(self) -> int:
        return len(self.refs)

    @property
    def free(self) -> int:
        return self.never_used + len(self.evictable)

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
        if b in self.evictable:
            del self.evictable[b]
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
                b, _ = self.evictable.popitem(last=False)
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
        for b in blocks:
            n = self.refs[b] - 1
            if n:
                self.refs[b] = n
                continue
            del self.refs[b]
            if b in self.hash_of:
                self.evictable[b] = None  # keep the content for a later prefix hit
            else:
                self.never_used += 1  # nothing worth keeping; recycle the id lazily
