"""The prefix cache: full KV blocks found again by their content (pure Python, no torch).

A full block's identity is a hash chained from its parent block's hash and its own token ids;
the chain starts from a salt, so that requests of different salts (tenants) never share a
block, and a shared block means the whole prefix before it is the same too. A block whose last
owner let go keeps its KV and its hash here, parked in LRU order: a later request with the same
prefix takes it back (a hit), and an allocation that finds no never-used block evicts the least
recently parked one. The block manager owns the reference counts; this keeps the hash map and
the parked blocks.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

BlockHash = bytes


def root_hash(salt: str) -> BlockHash:
    """The parent of a chain's first block: the salt alone."""
    return hashlib.blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def block_hash(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """One full block's hash: its parent's and its tokens' (int32: ids are checked < 2**31)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("i", token_ids).tobytes())
    return h.digest()


class PrefixCache:
    def __init__(self) -> None:
        self._block_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self._parked: OrderedDict[int, None] = OrderedDict()  # no owner; oldest first

    @property
    def num_parked(self) -> int:
        return len(self._parked)

    @property
    def num_hashed(self) -> int:
        return len(self._hash_of)

    def lookup(self, h: BlockHash) -> int | None:
        return self._block_of.get(h)

    def register(self, block: int, h: BlockHash) -> bool:
        """Make `block` findable by `h`; False (nothing changes) when another block has it."""
        if h in self._block_of or block in self._hash_of:
            return False
        self._block_of[h] = block
        self._hash_of[block] = h
        return True

    def park(self, block: int) -> bool:
        """The block's last owner let go: keep it findable if it has a hash (True)."""
        if block not in self._hash_of:
            return False
        self._parked[block] = None
        return True

    def unpark(self, block: int) -> None:
        """A parked block is owned again (a hit)."""
        del self._parked[block]

    def is_parked(self, block: int) -> bool:
        return block in self._parked

    def evict(self) -> int | None:
        """Forget the least recently parked block and hand it out; None when none is parked."""
        if not self._parked:
            return None
        block, _ = self._parked.popitem(last=False)
        del self._block_of[self._hash_of.pop(block)]
        return block

    def check_invariants(self, ref_counts: Sequence[int]) -> None:
        """The hash map is one-to-one; exactly the hashed blocks without owners are parked."""
        if len(self._block_of) != len(self._hash_of):
            raise AssertionError("hash map and block map differ in size")
        for h, block in self._block_of.items():
            if self._hash_of.get(block) != h:
                raise AssertionError(f"block {block} is not mapped back to its hash")
        for block in self._parked:
            if block not in self._hash_of:
                raise AssertionError(f"parked block {block} has no hash")
            if ref_counts[block] != 0:
                raise AssertionError(f"parked block {block} has {ref_counts[block]} owners")
        for block in self._hash_of:
            if ref_counts[block] == 0 and block not in self._parked:
                raise AssertionError(f"hashed block {block} has no owner and is not parked")
