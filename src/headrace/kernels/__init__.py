"""Hand-written CPU kernels for the hot spots torch has no fused op for (see docs/performance.md).

Each has a torch reference path beside it; `HEADRACE_CPU_KERNELS=0` turns them all off.
"""
