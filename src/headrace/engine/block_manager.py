"""Paged KV-cache bookkeeping: which fixed-size blocks each request owns (pure Python, no torch).

The block manager answers "does this fit" with blocks or `None`; whom to preempt when it does
not is the scheduler's decision.
"""

from __future__ import annotations

from collections import deque


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` KV entries."""
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole pool holds: no request may ever need more."""
        return self.num_blocks * self.block_size

    def block_table(self, request_id: str) -> list[int]:
        return list(self._tables.get(request_id, ()))

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """Extra blocks the request needs so that its table covers `num_tokens` tokens."""
        have = len(self._tables.get(request_id, ()))
        return max(0, blocks_for(num_tokens, self.block_size) - have)

    def can_fit(self, request_id: str, num_tokens: int) -> bool:
        return self.blocks_needed(request_id, num_tokens) <= len(self._free)

    def max_tokens_fitting(self, request_id: str) -> int:
        """The most tokens the request's table could cover with every free block added."""
        have = len(self._tables.get(request_id, ()))
        return (have + len(self._free)) * self.block_size

    def allocate(self, request_id: str, num_tokens: int) -> list[int] | None:
        """Grow the request's table to cover `num_tokens` tokens.

        Returns the newly added blocks (possibly none), or `None` — changing nothing — when
        the free pool is too small.
        """
        need = self.blocks_needed(request_id, num_tokens)
        if need > len(self._free):
            return None
        new = [self._free.popleft() for _ in range(need)]
        self._tables.setdefault(request_id, []).extend(new)
        return new

    def free(self, request_id: str) -> int:
        """Return all of the request's blocks to the pool; returns how many were freed."""
        table = self._tables.pop(request_id, [])
        self._free.extend(table)
        return len(table)

    def owners(self) -> list[str]:
        return list(self._tables)

    def check_invariants(self, num_tokens_by_request: dict[str, int] | None = None) -> None:
        """Raise AssertionError unless every block is free or owned by exactly one request.

        With `num_tokens_by_request` (request id -> tokens that have KV entries; call between
        steps), also check that each table holds exactly the blocks those tokens need.
        """
        seen: dict[int, str] = {}
        for block in self._free:
            if not 0 <= block < self.num_blocks:
                raise AssertionError(f"free block {block} out of range")
            if block in seen:
                raise AssertionError(f"block {block} is free twice")
            seen[block] = "<free>"
        for rid, table in self._tables.items():
            for block in table:
                if not 0 <= block < self.num_blocks:
                    raise AssertionError(f"block {block} of {rid} out of range")
                if block in seen:
                    raise AssertionError(f"block {block} owned by {rid} and {seen[block]}")
                seen[block] = rid
        if len(seen) != self.num_blocks:
            raise AssertionError(f"{self.num_blocks - len(seen)} blocks leaked")
        if num_tokens_by_request is None:
            return
        for rid, n in num_tokens_by_request.items():
            have = len(self._tables.get(rid, ()))
            if have != blocks_for(n, self.block_size):
                raise AssertionError(f"{rid}: {have} blocks for {n} computed tokens")
        for rid in self._tables:
            if rid not in num_tokens_by_request:
                raise AssertionError(f"blocks owned by {rid}, which the scheduler does not run")
