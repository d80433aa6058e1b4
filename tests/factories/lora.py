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


def write_random_adapter(model: Any, path: Path, rank: int, seed: int) -> None:
    """A random PEFT adapter of rank `rank` on all seven projections of every layer of our
    loaded `model` (shapes from its merged projections), written without transformers."""
    import json

    import torch
    from safetensors.torch import save_file

    from headrace.lora.manager import SITES

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(model.args.num_layers):
        for proj, (module, part) in SITES.items():
            linear = model.get_submodule(f"model.layers.{layer}.{module}")
            out, inp = linear.out_sizes[part], linear.in_features
            key = f"base_model.model.model.layers.{layer}.{module.split('.')[0]}.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) / inp**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, rank, generator=gen) / rank
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(SITES)}
    (path / "adapter_config.json").write_text(json.dumps(config))
