"""Architecture name (config.json `architectures[0]`) -> model class."""

from __future__ import annotations

from typing import Any

from headrace.models.base import CausalLM
from headrace.models.gemma3 import Gemma3ForCausalLM
from headrace.models.llama import LlamaForCausalLM, MistralForCausalLM
from headrace.models.qwen import Qwen2ForCausalLM, Qwen3ForCausalLM

MODELS: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
}


def architecture_of(cfg: dict[str, Any]) -> str | None:
    archs = cfg.get("architectures") or []
    return archs[0] if archs else None


def model_class(architecture: str | None) -> type[CausalLM] | None:
    return MODELS.get(architecture or "")
