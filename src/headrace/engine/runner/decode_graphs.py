"""Decode steps as CUDA graphs: the model's forward captured once per batch bucket, replayed.

An eager decode step of Gemma 3 270M launches 600-1,000 kernels from Python (each layer's
norms, rotary, projections, attention, residual adds); at 5-10 us a launch the host, not
the GPU, sets the pace of a model this small. A graph replays the whole forward in one
launch. What makes a step replayable: fixed shapes (the batch padded up to its bucket, the
block tables at a fixed width) and inputs read from the same buffers every time (each step's
tensors are copied into them), which the in-place decode attention allows
(kernels/paged_decode.py: a block table and bounds, no mask, no gather).

Padding rows decode token 0 at position 0, write their K/V to the pool's spare block (never
a sequence's) and attend to that one slot; their outputs are dropped. Taken: decode-only
steps (also `--deterministic`'s per-token steps) of up to 256 rows with no LoRA rows; other
steps run eagerly. Where nothing is captured (the CPU, `--enforce-eager`) `run` computes the
same over the same buffers eagerly: that is how the tests check padding and buffers here.

Shapes: buffers ids / positions / slots [N]; one block table [N, width] that every window
reads and per window bounds [3, N]; N = the largest bucket, width = the blocks of the longest
context.
"""

from __future__ import annotations

import logging
import time

import torch

from headrace.engine.kv.kv_cache import KVCache
from headrace.engine.runner.step_inputs import StepInputs
from headrace.layers.attention import AttentionMetadata, KVView
from headrace.models.base import CausalLM

log = logging.getLogger("headrace.engine.runner.model_runner")  # the runner's load-time lines
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class DecodeGraphs:
    def __init__(
        self, model: CausalLM, kv_cache: KVCache, max_model_len: int, per_token: bool = False
    ) -> None:
        """`kv_cache` with a spare block (KVCache(spare_block=True)); `per_token`: the runner's
        --deterministic steps, whose attention must not depend on the batch (no spans)."""
        self.splits = 1 if per_token else None
        assert kv_cache.spare_block is not None
        self.model, self.kv_caches = model, kv_cache.layers
        block_size, spare_block = kv_cache.block_size, kv_cache.spare_block
        self.spare_block, self.spare_slot = spare_block, spare_block * block_size
        windows = model.args.windows
        device = kv_cache.device
        n = BUCKETS[-1]

        def filled(shape: tuple[int, ...], value: int) -> torch.Tensor:
            return torch.full(shape, value, dtype=torch.int64, device=device)

        self.ids, self.positions = filled((n,), 0), filled((n,), 0)
        self.slots = filled((n,), self.spare_slot)
        # one table for every window (step_inputs: base 0, each window's own bounds)
        self.table = filled((n, -(-max_model_len // block_size)), spare_block)
        # padding rows: base 0, attend to [0, 1), the first slot of table[row, 0], the spare block
        self.pad_bounds = filled((3, n), 0)
        self.pad_bounds[2] = 1
        self.bounds = {w: self.pad_bounds.clone() for w in windows}
        self._metas = {b: self._meta(b) for b in BUCKETS}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._out: dict[int, torch.Tensor] = {}

    def _meta(self, b: int) -> AttentionMetadata:
        views = {
            w: KVView(self.table[:b], None, self.bounds[w][:, :b], self.splits) for w in self.bounds
        }
        return AttentionMetadata(self.slots[:b], b, views, [])

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    @staticmethod
    def takes(inputs: StepInputs) -> bool:
        """A step the buffers can hold: decodes only, each attending in place, no adapters."""
        meta = inputs.meta
        rows = int(inputs.input_ids.shape[0])
        return (
            not meta.prefills
            and meta.num_decodes == rows <= BUCKETS[-1]
            and not inputs.lora_segments
            and all(view.bounds is not None for view in meta.decode_views.values())
            and len({id(view.block_table) for view in meta.decode_views.values()}) == 1
        )

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """The step's hidden states [T, H], as the model's forward gives them."""
        t = int(inputs.input_ids.shape[0])
        b = next(x for x in BUCKETS if x >= t)
        self._fill(inputs, t, b)
        graph = self._graphs.get(b)
        if graph is None:
            return self._forward(b)[:t]
        graph.replay()
        return self._out[b][:t]

    def _fill(self, inputs: StepInputs, t: int, b: int) -> None:
        meta = inputs.meta
        self.ids[:t].copy_(inputs.input_ids)
        self.positions[:t].copy_(inputs.positions)
        self.slots[:t].copy_(meta.slot_mapping)
        self.ids[t:b] = 0
        self.positions[t:b] = 0
        self.slots[t:b] = self.spare_slot
        table = next(iter(meta.decode_views.values())).block_table  # every window's (takes)
        self.table[:t, : table.shape[1]].copy_(table)
        self.table[t:b, 0] = self.spare_block
        for w, view in meta.decode_views.items():
            assert view.bounds is not None
            self.bounds[w][:, :t].copy_(view.bounds)
            self.bounds[w][:, t:b].copy_(self.pad_bounds[:, t:b])

    def _forward(self, b: int) -> torch.Tensor:
        with torch.inference_mode():
            out: torch.Tensor = self.model(
                self.ids[:b], self.positions[:b], self.kv_caches, self._metas[b]
            )
            return out

    def capture(self) -> None:
        """Record every bucket's forward (CUDA), largest first so the smaller ones reuse its
        memory pool. Padding-only inputs: the warm-up and the capture touch the spare block."""
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(BUCKETS):
            self._forward(b)  # lazy set-up (Triton compiles, cuBLAS workspaces) outside
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._out[b] = self._forward(b)
            self._graphs[b] = graph
        torch.cuda.synchronize()


def decode_graphs(
    model: CausalLM, kv_cache: KVCache, max_model_len: int, per_token: bool = False
) -> DecodeGraphs | None:
    """The runner's graphs where its pool has a spare block: captured on CUDA (None, with a
    warning, if capture fails: decode steps then run eagerly), plain buffers elsewhere."""
    if kv_cache.spare_block is None:
        return None
    graphs = DecodeGraphs(model, kv_cache, max_model_len, per_token)
    if kv_cache.device.type != "cuda":
        return graphs
    start = time.perf_counter()
    try:
        graphs.capture()
    except Exception as e:  # a forward that cannot be captured still serves eagerly
        log.warning("CUDA graph capture failed (%s): decode steps run eagerly", e)
        torch.cuda.synchronize()  # unless the device is broken: then this raises, and start fails
        return None
    log.info(
        "decode steps of 1-%d rows replay CUDA graphs (%d buckets, captured in %.1f s)",
        BUCKETS[-1], len(BUCKETS), time.perf_counter() - start,
    )  # fmt: skip
    return graphs
