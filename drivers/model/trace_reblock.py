"""A trace's hash ids at another block size (`trace export`: Mooncake's 512 tokens from a recording's 16, an agentic
trace's 64, ...), so that two prompts share their first k blocks exactly when they share the tokens those k
blocks cover.

Block j of a prompt (tokens j*B up to (j+1)*B, or its end) is a chained hash, as a block-hashed prefix cache keys
a block: of block j-1's id, how many tokens block j holds, and the ids of the source blocks that cover those
tokens. A source id stands for its block's tokens, so equal keys mean equal tokens from the prompt's start. The
hashes are numbered 1, 2, 3... in the order they are first met, as Mooncake's own traces number their blocks.
What is held is one entry per distinct block: an 8-byte digest and its number.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_ROOT = 0  # the id "before" a prompt's first block: a prompt's first block chains from it


class Reblocker:
    """Hash ids of `source_block`-token blocks as ids of `target_block`-token blocks, numbered across every prompt
    it is given (in the order given, the trace's due order)."""

    def __init__(self, source_block: int, target_block: int):
        self.source_block, self.target_block = source_block, target_block
        self._numbers: dict[bytes, int] = {}

    def ids(self, hash_ids: Sequence[int], input_length: int) -> list[int]:
        """The prompt's blocks at the target size: ceil(input_length / target_block) ids, the last maybe partial."""
        out: list[int] = []
        parent = _ROOT
        b, size, numbers, blake = self.source_block, self.target_block, self._numbers, hashlib.blake2b
        for start in range(0, input_length, size):  # an export's hot loop: once a block of every prompt
            held = input_length - start if input_length - start < size else size
            covering = ",".join(map(str, hash_ids[start // b : (start + held - 1) // b + 1]))
            key = blake(b"%d:%d:%s" % (parent, held, covering.encode()), digest_size=8).digest()
            parent = numbers.get(key) or numbers.setdefault(key, len(numbers) + 1)
            out.append(parent)
        return out

    @property
    def distinct(self) -> int:
        """How many distinct blocks have been numbered."""
        return len(self._numbers)
