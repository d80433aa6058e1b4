"""The front end's side of the engine: the engine client the HTTP layer knows, the async engine
that talks to a core, and per-request text (detokenizing, stop strings, limits).
"""
