"""Write a loadable model as a dense Hugging Face directory that transformers can open.

The source is the HF directory `resolve_model` gives (for a GGUF: its converted cache entry), so
tensors keep transformers' names; a tied output head is stored once, as
`model.embed_tokens.weight`. The tokenizer config carries a chat template (the model's own, or
the default Headrace uses for it) and generation_config.json the full EOS list.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from headrace.loader.files import read_json
from headrace.loader.hf import iter_tensors, load_model, read_config, safetensors_files
from headrace.loader.tokenizer import Tokenizer
from headrace.models.registry import architecture_of

log = logging.getLogger(__name__)
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def export_model(model_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    # Loading first checks every tensor's name and shape, so a broken source fails here.
    model, cfg = load_model(model_dir, dtype, torch.device("cpu"), 2)
    eos, tied = list(model.args.eos_token_ids), model.args.tie_word_embeddings
    del model
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor, _ in iter_tensors(safetensors_files(model_dir)):
        if not (tied and name == "lm_head.weight"):
            tensors[name] = tensor.to(dtype).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        **read_config(model_dir),
        "torch_dtype": DTYPE_NAMES[dtype],
        "dtype": DTYPE_NAMES[dtype],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer = _write_tokenizer(model_dir, out)
    eos = list(dict.fromkeys(eos + list(tokenizer.eos_token_ids)))
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos}
    if cfg.get("pad_token_id") is not None:
        generation["pad_token_id"] = cfg["pad_token_id"]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    log.info("exported %s to %s (%s)", model_dir, out, DTYPE_NAMES[dtype])
    return out


def _write_tokenizer(model_dir: Path, out: Path) -> Tokenizer:
    config_path = model_dir / "tokenizer_config.json"
    config: dict[str, Any] = (
        read_json(config_path, "tokenizer config") if config_path.is_file() else {}
    )
    shutil.copyfile(model_dir / "tokenizer.json", out / "tokenizer.json")
    arch = architecture_of(read_config(model_dir))
    tokenizer = Tokenizer.from_file(out / "tokenizer.json", config, arch)
    config["chat_template"] = tokenizer.template_source
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tokenizer
