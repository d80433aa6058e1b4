"""transformers' own load of the embedded Gemma 3 GGUF (`gguf_file=`), once per session: it
dequantizes in Python (about 45-65 s on 2 cores), and the parity tests of the model
(tests/models) and of LoRA (tests/lora) compare against the same reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headrace.loader.cache import default_model_path


@pytest.fixture(scope="session")
def hf_gemma() -> tuple[Any, Any]:
    """(model in fp32, eval mode; its tokenizer). Shared: a test that changes the model (peft
    injects layers) works on a copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), tokenizer
