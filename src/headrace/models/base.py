"""What every model family shares: embedding, the per-step rope tables, the output head."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headrace.kernels import bf16_linear, q8_head
from headrace.layers.attention import AttentionMetadata
from headrace.layers.linear import MergedLinear, pack_weight, packed_linear
from headrace.layers.rotary import RotaryEmbedding
from headrace.models.args import ModelArgs

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K, V pools [N, bs, Hkv, D]
CosSin = dict[str, tuple[torch.Tensor, torch.Tensor]]  # rope key -> cos, sin [T, 1, D]


# Projections whose input is an RMSNorm output. Per-row int8 keeps those; the inputs of o_proj
# (attention output) and down_proj (act(gate) * up) have a few channels far above the rest, and
# per-row int8 rounds the others away: Gemma 3 270M's held-out perplexity rose 4.7% with
# down_proj in int8 alone, 0.3% with o_proj, and fell 1.0% with these two (docs/performance.md).
INT8_PROJECTIONS = ("qkv_proj", "gate_up_proj")


class CausalLM(nn.Module):
    """A decoder-only LM over a paged KV cache. Module names follow Hugging Face's
    (`model.layers.3.self_attn...`), except the merged `qkv_proj` / `gate_up_proj`."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.ropes: dict[str, RotaryEmbedding] = {}
        self.lm_head: nn.Module | None = None
        self.packed_head: torch.Tensor | None = None
        self.small_head: torch.Tensor | None = None  # bf16_linear's layout, in its place
        self.q8_head: q8_head.Q8Head | None = None  # a GGUF's Q8_0 head, for few-row steps

    @classmethod
    def parse_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        """The family's reading of a Hugging Face config.json dict."""
        raise NotImplementedError

    def setup(self, max_len: int, device: torch.device) -> None:
        """Build the rope tables for positions < max_len once the weights are in place."""
        self.ropes = {
            key: RotaryEmbedding(
                self.args.head_dim, params, self.args.max_position_embeddings, max_len
            ).to(device)
            for key, params in self.args.rope.items()
        }
        for module in self.modules():
            if isinstance(module, MergedLinear):
                module.pack()
            prepare = getattr(module, "prepare", None)
            if callable(prepare):  # per-layer constants that depend on loaded weights
                prepare()
        if self.lm_head is None:  # tied: the embedding stays for lookups, the head is packed
            # bf16_linear's kernel where it runs: 1.2-1.8x oneDNN's packed bf16 matmul on the
            # head at 1-48 rows, as fast from 64 to 512 (`bench/kernels.py --only head-bf16`).
            # Only where packing is on at all (the layers pack likewise): a probe on 64 rows.
            if pack_weight(self.embed_weight[:64]) is not None and bf16_linear.supported(
                self.embed_weight
            ):
                self.small_head = bf16_linear.pack(self.embed_weight)
            else:
                self.packed_head = pack_weight(self.embed_weight)

    def quantize_matmuls(self, with_lora: bool = False) -> int:
        """Int8 copies of the projections in INT8_PROJECTIONS; how many were made. `with_lora`:
        steps with LoRA adapter rows take them too (MergedLinear.int8_with_lora)."""
        linears = [
            m
            for name, m in self.named_modules()
            if isinstance(m, MergedLinear) and name.rsplit(".", 1)[-1] in INT8_PROJECTIONS
        ]
        return sum(m.quantize(with_lora) for m in linears)

    def use_head_blocks(
        self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
    ) -> bool:
        """Take a tied bf16 head's Q8_0 blocks (loader/gguf_blocks.py's form) for steps of up to
        q8_head.MAX_ROWS rows; False where they are not Q8_0's or the kernel cannot serve."""
        weight = self.embed_weight
        if self.lm_head is not None or weight.dtype != torch.bfloat16:
            return False
        if weight.device.type != "cpu":
            return False
        if tuple(codes.shape) != tuple(weight.shape) or not q8_head.supported(*weight.shape):
            return False
        form = q8_head.q8_form(codes, scale, offset)
        if form is None:
            return False
        self.q8_head = q8_head.pack(*form)
        return True

    @property
    def few_row_head(self) -> int:
        """Steps of up to this many rows compute their logits on the Q8_0 head (0: none)."""
        return q8_head.MAX_ROWS if self.q8_head is not None else 0

    def make_row_invariant(self) -> tuple[int, int]:
        """Every projection on its row-independent path (--deterministic): (switched, all)."""
        self.q8_head = None
        linears = [m for m in self.modules() if isinstance(m, MergedLinear)]
        return sum(m.make_row_invariant() for m in linears), len(linears)

    @property
    def embed_weight(self) -> torch.Tensor:
        weight = self.get_submodule("model.embed_tokens").weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        return F.embedding(input_ids, self.embed_weight)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> CosSin:
        return {key: rope.cos_sin(positions, dtype) for key, rope in self.ropes.items()}

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: KVCaches,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H], after the final norm
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [S, H] -> [S, V]
        if self.lm_head is not None:
            logits = self.lm_head(hidden)
        elif self.q8_head is not None and _few_bf16_rows(hidden):
            logits = q8_head.logits(hidden, self.q8_head)
        elif self.small_head is not None and hidden.dim() == 2:
            logits = bf16_linear.linear(hidden, self.small_head, None)
        elif self.packed_head is not None:
            logits = packed_linear(hidden, self.packed_head, None)
        elif hidden.device.type == "cpu" and hidden.dtype == torch.float32 and len(hidden) <= 64:
            # MKL's x @ W^T is 2-3x slower than (W @ x^T)^T for a few rows against 262k
            logits = torch.mm(self.embed_weight, hidden.t()).t().contiguous()
        else:
            logits = F.linear(hidden, self.embed_weight)
        cap = self.args.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits.float() / cap) * cap
        return logits  # the model's dtype (fp32 from the Q8_0 head): the sampler casts as it draws


def _few_bf16_rows(hidden: torch.Tensor) -> bool:
    return (
        hidden.dim() == 2
        and 0 < len(hidden) <= q8_head.MAX_ROWS
        and hidden.dtype == torch.bfloat16
        and hidden.device.type == "cpu"
    )


class Embedding(nn.Module):
    """A bare weight [V, H]; no random init (nn.Embedding's costs seconds at 262k x 640)."""

    def __init__(self, num: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim), requires_grad=False)
