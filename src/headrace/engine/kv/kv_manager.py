"""The scheduler's view of KV memory: a request's blocks through a few calls that hide the
prefix cache, its promises and its statistics (nano-vllm's block API, vLLM v1's
KVCacheManager; `block_manager.BlockManager` does the bookkeeping underneath).

    match(req)      a waiting request starts at its cached prefix (or waits: None)
    release(req)    a request that stays waiting lets go of what it matched
    allocate(req, n) / free(req)
    admitted(req, hit, now)   it runs: promise the blocks it will compute, count its hit
    computed(req, drafted)    after a step: drop rejected drafts' slots, offer full blocks
"""

from __future__ import annotations

from headrace.engine.kv.block_manager import BlockManager
from headrace.request import Request

# Admission keeps this share of the pool free so that running requests can grow a block
# without preempting a request that was admitted a step earlier.
WATERMARK = 0.01


def known_tokens(req: Request) -> list[int]:
    """The tokens a waiting request will compute: its prompt, and after a preemption the
    tokens it had generated too."""
    return req.prompt_token_ids if not req.output_token_ids else req.all_token_ids


class KVManager:
    def __init__(self, blocks: BlockManager) -> None:
        self.blocks = blocks
        self.prefix_queries_total = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits_total = 0  # ... and found there

    def match(self, req: Request) -> int | None:
        """Start a waiting request at its cached prefix: the tokens found, or None when the
        block after them is being computed by a running request (the match is let go: waiting
        a step or two turns it into a hit)."""
        rid, tokens = req.request_id, known_tokens(req)
        hit = 0
        if self.blocks.caching and not self.blocks.num_blocks_of(rid):
            req.num_computed_tokens = hit = self.blocks.match(rid, tokens, req.cache_salt)
        if self.blocks.next_block_promised(rid, tokens, req.cache_salt):
            self.release(req)
            return None
        return hit

    def release(self, req: Request) -> None:
        """A request that stays waiting lets go of the cached blocks it matched."""
        self.blocks.free(req.request_id)
        req.num_computed_tokens = 0

    def has_room(self, req: Request, n: int, others_running: bool) -> bool:
        """Free blocks for `req`'s next `n` tokens, keeping the watermark while others run."""
        need = self.blocks.blocks_needed(req.request_id, req.num_computed_tokens + n)
        reserve = int(self.blocks.num_blocks * WATERMARK) if others_running else 0
        return need + reserve <= self.blocks.num_free_blocks

    def allocate(self, req: Request, num_tokens: int) -> bool:
        return self.blocks.allocate(req.request_id, num_tokens) is not None

    def free(self, req: Request) -> None:
        self.blocks.free(req.request_id)

    def admitted(self, req: Request, hit: int, first: bool) -> None:
        """`req` runs from now: it will compute the blocks past its prefix (later requests
        with the same prefix wait for them); its first admission counts its cache hit."""
        self.blocks.promise(req.request_id, known_tokens(req), req.cache_salt)
        if first:
            req.num_cached_tokens = hit
            self.prefix_queries_total += req.num_prompt_tokens if self.blocks.caching else 0
            self.prefix_hits_total += hit

    def computed(self, req: Request, drafted: bool) -> None:
        """After a step: a speculative one's rejected drafts give back their slots; the full
        blocks computed so far become findable by prefix."""
        rid, done = req.request_id, req.num_computed_tokens
        if drafted:
            self.blocks.trim(rid, done)
        if self.blocks.num_uncached_full_blocks(rid, done) > 0:
            self.blocks.cache_computed(rid, req.all_token_ids, done, req.cache_salt)
