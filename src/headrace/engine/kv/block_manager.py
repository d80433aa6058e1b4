"""Paged KV-cache bookkeeping: which fixed-size blocks each request owns (pure Python, no torch).

The block manager answers "does this fit" with blocks or `None`; whom to preempt when it does
not is the scheduler's decision. With prefix caching on, a block may be owned by several
requests (reference counts): `match` gives a new request the cached blocks of its prefix, and
`cache_computed` makes a request's full, computed blocks findable for later ones. A block
nobody owns is free: never used, or parked in the prefix cache until an allocation evicts it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from headrace.engine.kv.prefix_cache import BlockHash, PrefixCache, block_hash, root_hash
from headrace.engine.kv.table_epochs import new_table_epoch


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` KV entries."""
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))  # unowned and not cached
        self._refs = [0] * num_blocks
        self._tables: dict[str, list[int]] = {}
        self._epochs: dict[str, int] = {}  # new whenever a table changes but at its end
        self.cache = PrefixCache() if enable_caching else None
        self._chains: dict[str, list[BlockHash]] = {}  # hashes of each table's cached head
        # Full prompt blocks that running requests are computing: a request that needs one of
        # them next waits for it instead of computing it a second time.
        self._promised: dict[BlockHash, str] = {}
        self._promises: dict[str, list[BlockHash]] = {}

    @property
    def caching(self) -> bool:
        return self.cache is not None

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: never used, or cached without an owner."""
        return len(self._free) + (self.cache.num_parked if self.cache else 0)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by their prefix, owned or not."""
        return self.cache.num_hashed if self.cache else 0

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole pool holds: no request may ever need more."""
        return self.num_blocks * self.block_size

    def block_table(self, request_id: str) -> list[int]:
        return list(self._tables.get(request_id, ()))

    def table_epoch(self, request_id: str) -> int:
        """The same number for as long as the request's table only grows at its end."""
        return self._epochs.get(request_id, 0)

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def num_freeable(self, request_id: str) -> int:
        """Blocks that freeing the request would give back (those no other request shares)."""
        return sum(1 for b in self._tables.get(request_id, ()) if self._refs[b] == 1)

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """Extra blocks the request needs so that its table covers `num_tokens` tokens."""
        have = len(self._tables.get(request_id, ()))
        return max(0, blocks_for(num_tokens, self.block_size) - have)

    def covers(self, request_id: str, num_tokens: int) -> bool:
        """Whether the request's table already holds `num_tokens` tokens (no block to add)."""
        return len(self._tables.get(request_id, ())) * self.block_size >= num_tokens

    def can_fit(self, request_id: str, num_tokens: int) -> bool:
        return self.blocks_needed(request_id, num_tokens) <= self.num_free_blocks

    def max_tokens_fitting(self, request_id: str) -> int:
        """The most tokens the request's table could cover with every free block added."""
        have = len(self._tables.get(request_id, ()))
        return (have + self.num_free_blocks) * self.block_size

    def allocate(self, request_id: str, num_tokens: int) -> list[int] | None:
        """Grow the request's table to cover `num_tokens` tokens: the blocks added (possibly
        none), or `None` — changing nothing — when the free pool is too small."""
        need = self.blocks_needed(request_id, num_tokens)
        if need > self.num_free_blocks:
            return None
        new = [self._take() for _ in range(need)]
        if request_id not in self._tables:
            self._tables[request_id] = []
            self._epochs[request_id] = new_table_epoch()
        self._tables[request_id].extend(new)
        return new

    def free(self, request_id: str) -> int:
        """Let go of all of the request's blocks; returns how many it held."""
        table = self._tables.pop(request_id, [])
        self._epochs.pop(request_id, None)
        self._chains.pop(request_id, None)
        for h in self._promises.pop(request_id, ()):
            if self._promised.get(h) == request_id:
                del self._promised[h]
        # Tail first: of one request's parked blocks, its last ones are evicted first.
        for block in reversed(table):
            self._refs[block] -= 1
            if self._refs[block] == 0 and not (self.cache and self.cache.park(block)):
                self._free.append(block)
        return len(table)

    def trim(self, request_id: str, num_tokens: int) -> int:
        """Give back the blocks past the first `num_tokens` tokens (those of a speculative
        step's rejected drafts); returns how many. Such blocks are the request's own: only
        computed full blocks are ever shared or cached."""
        table = self._tables.get(request_id, [])
        keep = blocks_for(num_tokens, self.block_size)
        extra = table[keep:]
        del table[keep:]
        if extra:
            self._epochs[request_id] = new_table_epoch()
        for block in reversed(extra):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)
        return len(extra)

    def owners(self) -> list[str]:
        return list(self._tables)

    # -- prefix caching ---------------------------------------------------------------------

    def match(self, request_id: str, token_ids: Sequence[int], salt: str) -> int:
        """Give a request without blocks the cached blocks of its longest cached prefix.

        Returns the tokens they hold: whole blocks, never all of `token_ids` (the last token
        is left to compute, so that the step has logits to sample from). 0 without caching.
        """
        if self.cache is None or request_id in self._tables:
            return 0
        bs = self.block_size
        chain: list[BlockHash] = []
        table: list[int] = []
        parent = root_hash(salt)
        for i in range((len(token_ids) - 1) // bs):
            h = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            block = self.cache.lookup(h)
            if block is None:
                break
            if self._refs[block] == 0:
                self.cache.unpark(block)
            self._refs[block] += 1
            chain.append(h)
            table.append(block)
            parent = h
        if table:
            self._tables[request_id] = table
            self._epochs[request_id] = new_table_epoch()
            self._chains[request_id] = chain
        return len(table) * bs

    def next_block_promised(self, request_id: str, token_ids: Sequence[int], salt: str) -> bool:
        """Whether the first full block past the request's matched prefix is being computed by
        another running request (so that waiting a step or two turns it into a hit)."""
        if self.cache is None:
            return False
        chain = self._chains.get(request_id, [])
        i, bs = len(chain), self.block_size
        if (i + 1) * bs > len(token_ids) - 1:  # no full block left before the last token
            return False
        h = block_hash(chain[-1] if chain else root_hash(salt), token_ids[i * bs : (i + 1) * bs])
        return self._promised.get(h, request_id) != request_id

    def promise(self, request_id: str, token_ids: Sequence[int], salt: str) -> None:
        """The request will compute the full blocks of `token_ids` past its matched prefix."""
        if self.cache is None:
            return
        chain = self._chains.get(request_id, [])
        parent, bs = chain[-1] if chain else root_hash(salt), self.block_size
        promised = []
        for i in range(len(chain), len(token_ids) // bs):
            parent = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            if self._promised.setdefault(parent, request_id) == request_id:
                promised.append(parent)
        self._promises[request_id] = promised

    def num_uncached_full_blocks(self, request_id: str, num_computed_tokens: int) -> int:
        """Full computed blocks of the request not yet offered to the cache (0 without one)."""
        if self.cache is None:
            return 0
        done = len(self._chains.get(request_id, ()))
        return num_computed_tokens // self.block_size - done

    def cache_computed(
        self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int, salt: str
    ) -> None:
        """Make the request's full blocks up to `num_computed_tokens` findable by prefix.

        `token_ids` are the request's tokens (at least the computed ones). A block whose
        prefix another block already holds (two requests computed it at once) stays private.
        """
        if self.cache is None:
            return
        bs = self.block_size
        table = self._tables[request_id]
        chain = self._chains.setdefault(request_id, [])
        parent = chain[-1] if chain else root_hash(salt)
        for i in range(len(chain), num_computed_tokens // bs):
            parent = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            self.cache.register(table[i], parent)
            chain.append(parent)
            if self._promised.get(parent) == request_id:  # kept: found in the cache from now
                del self._promised[parent]

    # -- checks -----------------------------------------------------------------------------

    def check_invariants(self, num_tokens_by_request: dict[str, int] | None = None) -> None:
        """Raise AssertionError unless every block is free, parked in the cache, or owned by
        as many tables as its reference count says (and at most once by each).

        With `num_tokens_by_request` (request id -> tokens that have KV entries; call between
        steps), also check that each table holds exactly the blocks those tokens need.
        """
        owners = self._check_tables()
        for block in range(self.num_blocks):
            refs, owned = self._refs[block], owners[block]
            if owned > refs:
                raise AssertionError(f"block {block} owned by {owned} tables, counted {refs}")
            if owned < refs:
                raise AssertionError(f"block {block} leaked: counted {refs}, owned by {owned}")
        self._check_free()
        if self.cache is not None:
            self.cache.check_invariants(self._refs)
        if len(owners) + self.num_free_blocks != self.num_blocks:
            raise AssertionError(f"{self.num_blocks - len(owners) - self.num_free_blocks} leaked")
        if self._epochs.keys() != self._tables.keys():
            raise AssertionError("a table without an epoch, or an epoch without a table")
        for rid, chain in self._chains.items():
            if len(chain) > len(self._tables.get(rid, ())):
                raise AssertionError(f"{rid} has hashes for more blocks than it holds")
        for h, rid in self._promised.items():
            if rid not in self._tables or h not in self._promises.get(rid, ()):
                raise AssertionError(f"a block is promised by {rid}, which holds no promise")
        if num_tokens_by_request is not None:
            self._check_table_sizes(num_tokens_by_request)

    def _check_tables(self) -> Counter[int]:
        """How many tables own each block, once each table holds distinct blocks in range."""
        owners: Counter[int] = Counter()
        for rid, table in self._tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"{rid} holds a block twice")
            for block in table:
                if not 0 <= block < self.num_blocks:
                    raise AssertionError(f"block {block} of {rid} out of range")
            owners.update(table)
        return owners

    def _check_free(self) -> None:
        if len(set(self._free)) != len(self._free):
            raise AssertionError("a block is free twice")
        for block in self._free:
            if not 0 <= block < self.num_blocks:
                raise AssertionError(f"free block {block} out of range")
            if self._refs[block] != 0:
                raise AssertionError(f"block {block} is free and owned by {self._refs[block]}")
            if self.cache is not None and self.cache.is_parked(block):
                raise AssertionError(f"block {block} is free and parked")

    def _check_table_sizes(self, num_tokens_by_request: dict[str, int]) -> None:
        for rid, n in num_tokens_by_request.items():
            have = len(self._tables.get(rid, ()))
            if have != blocks_for(n, self.block_size):
                raise AssertionError(f"{rid}: {have} blocks for {n} computed tokens")
        for rid in self._tables:
            if rid not in num_tokens_by_request:
                raise AssertionError(f"blocks owned by {rid}, which the scheduler does not run")

    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            assert self.cache is not None  # num_free_blocks counted the parked ones
            evicted = self.cache.evict()
            assert evicted is not None
            block = evicted
        self._refs[block] = 1
        return block
