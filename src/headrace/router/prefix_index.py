"""The router's guess at which prompt prefixes each replica holds in its prefix cache.

SGLang's gateway keeps an approximate radix tree per worker; here, as in the engine's own
cache, a prompt is a chain of block hashes (salted like the engine's, so one tenant's prompts
never look cached for another), and each replica keeps the hashes of what was last sent to it,
bounded and least recently used first out. The guess can be stale — the replica may have
evicted a block — which costs a miss, never a wrong answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from headrace.engine.kv.prefix_cache import BlockHash, block_hash, root_hash

ROUTING_BLOCK = 16  # tokens per hashed block; the engines' own block size need not match
MAX_BLOCKS_PER_REPLICA = 1 << 16  # about a million tokens of prompts remembered


def prefix_hashes(
    token_ids: Sequence[int], salt: str, block: int = ROUTING_BLOCK
) -> list[BlockHash]:
    """The chain hashes of the prompt's full blocks."""
    hashes: list[BlockHash] = []
    parent = root_hash(salt)
    for i in range(len(token_ids) // block):
        parent = block_hash(parent, token_ids[i * block : (i + 1) * block])
        hashes.append(parent)
    return hashes


class PrefixIndex:
    """The prefixes sent to one replica."""

    def __init__(self, max_blocks: int = MAX_BLOCKS_PER_REPLICA) -> None:
        self.max_blocks = max_blocks
        self._seen: OrderedDict[BlockHash, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def match(self, hashes: Sequence[BlockHash]) -> int:
        """How many of the leading blocks were sent here (and are still remembered)."""
        n = 0
        for h in hashes:
            if h not in self._seen:
                break
            n += 1
        return n

    def record(self, hashes: Sequence[BlockHash]) -> None:
        """The prompt went here: its blocks are the most recently used."""
        for h in hashes:
            self._seen[h] = None
            self._seen.move_to_end(h)
        while len(self._seen) > self.max_blocks:
            self._seen.popitem(last=False)

    def clear(self) -> None:
        """The replica restarted: its cache is empty."""
        self._seen.clear()
