"""Random PEFT LoRA adapters on the tiny models (`peft` is a test dependency only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(
    model_dir: Path,
    path: Path,
    seed: int,
    r: int = 8,
    alpha: float = 32,
    targets: tuple[str, ...] = ALL_TARGETS,
    rslora: bool = False,
) -> Any:
    """Save a random LoRA adapter (A and B both random: `init_lora_weights=False`) for the
    model in `model_dir` into `path`; return the transformers + peft model (fp32, eval)."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    base = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=r, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False,
        use_rslora=rslora, lora_dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = get_peft_model(base, config)
    model.eval()
    model.save_pretrained(path)
    return model
