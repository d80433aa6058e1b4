"""The paged KV cache: the pool, the block manager with the prefix cache it hides, the pool's
size.
"""
