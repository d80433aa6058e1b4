"""The model runner: a step's tensors, the forward pass, and picking tokens (sampler, top_p, the
int8 head's exact picks, grammars, speculation checks).
"""
